;; A component that exports `init` (with the right type) but no `transform`.
(component
  (core module $m
    (memory (export "memory") 1)
    ;; result<_, string> is returned through a pointer; zeroed memory at 16 reads as `ok`.
    (func (export "init") (param i32 i32) (result i32) i32.const 16)
    (func (export "realloc") (param i32 i32 i32 i32) (result i32) i32.const 1024))
  (core instance $i (instantiate $m))
  (func (export "init") (param "config" (list (tuple string string))) (result (result (error string)))
    (canon lift (core func $i "init") (memory (core memory $i "memory"))
      (realloc (core func $i "realloc")))))
