;; A component built against contract 0.2.0, whose timestamps counted from 1970: it imports the
;; host interface of zipline:transform@0.2.0, which this Zipline (0.3.0) does not implement.
(component
  (import "zipline:transform/host@0.2.0" (instance $host
    (export "log" (func (param "message" string)))))
  (core module $m
    (func (export "run")))
  (core instance $i (instantiate $m))
  (func (export "run") (canon lift (core func $i "run"))))
