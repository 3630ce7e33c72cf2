;; A component built against an older contract: it imports the host interface of
;; zipline:transform@0.1.0, which this Zipline does not implement.
(component
  (import "zipline:transform/host@0.1.0" (instance $host
    (export "log" (func (param "message" string)))))
  (core module $m
    (func (export "run")))
  (core instance $i (instantiate $m))
  (func (export "run") (canon lift (core func $i "run"))))
