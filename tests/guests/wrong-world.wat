;; A valid component of the wrong world: it exports `run: func()` and nothing Zipline calls.
(component
  (core module $m
    (func (export "run")))
  (core instance $i (instantiate $m))
  (func (export "run") (canon lift (core func $i "run"))))
