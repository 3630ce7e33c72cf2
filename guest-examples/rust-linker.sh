# Sourced by the Rust guest build scripts. Debian's rustc-web looks for its wasm linker as
# `rust-lld` in its sysroot; some rustc-web builds ship without that link (only lld-22's
# `wasm-ld-22`), which fails with "linker `rust-lld` not found". Point cargo at wasm-ld-22
# directly then: it is the same linker, called by its wasm flavour's own name.
if [[ ! -e "$(/usr/bin/rustc --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/bin/rust-lld" ]] \
  && command -v wasm-ld-22 >/dev/null; then
  export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=wasm-ld-22
  export CARGO_TARGET_WASM32_WASIP1_LINKER=wasm-ld-22
fi
