;; A component that imports an interface Zipline does not provide.
(component
  (import "acme:secrets/vault" (instance $vault
    (export "get" (func (param "name" string) (result string)))))
  (core module $m
    (func (export "run")))
  (core instance $i (instantiate $m))
  (func (export "run") (canon lift (core func $i "run"))))
