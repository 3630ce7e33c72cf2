//! One wasmtime engine for the process, its epoch ticker, the linker every transform is
//! instantiated through, and loading a component file into a pre-instantiated [`Module`].
//!
//! Time limits use epoch interruption
//! (<https://docs.rs/wasmtime/48.0.8/wasmtime/struct.Config.html#method.epoch_interruption>):
//! a single thread bumps the engine's epoch every [`TICK`], and each call sets its store's
//! deadline to the call's timeout in ticks, so a guest that spins is stopped with a trap within
//! one tick of its limit. Checking the epoch costs a load and a compare at function entries and
//! loop back-edges, far less than fuel metering.
//!
//! The linker provides `zipline:transform/host` and WASI preview 2 (synchronous bindings, for
//! guests built against WASI: Go, Rust wasip1/wasip2, componentize-py without stubs); the
//! sandbox lives in the per-store context ([`super::host`]). A component that imports
//! anything else fails at [`Module::load`] with the missing interface named.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine};

use super::bindings::{Transform, TransformPre};
use super::cache;
use super::host::HostState;

/// The WIT package and version this host implements (`wit/transform.wit`).
pub(crate) const CONTRACT: &str = "zipline:transform@0.3.0";

/// How often the epoch advances: the granularity of time limits.
pub(crate) const TICK: Duration = Duration::from_millis(10);

pub(crate) struct Shared {
    pub(crate) engine: Engine,
    linker: Linker<HostState>,
    /// Compiled components by content hash: a module validated at load time and started by the
    /// pipeline moments later is compiled (or read from the disk cache) once.
    compiled: Mutex<HashMap<[u8; 32], Component>>,
}

static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();

/// The process's engine and linker, created (with the ticker thread) on first use.
pub(crate) fn shared() -> Result<&'static Shared, String> {
    SHARED
        .get_or_init(|| create().map_err(|e| format!("cannot start the WebAssembly engine: {e:#}")))
        .as_ref()
        .map_err(Clone::clone)
}

fn create() -> wasmtime::Result<Shared> {
    let mut config = Config::new();
    config
        .epoch_interruption(true)
        .wasm_component_model(true)
        .cranelift_opt_level(wasmtime::OptLevel::Speed)
        .parallel_compilation(true);
    let engine = Engine::new(&config)?;
    let mut linker = Linker::new(&engine);
    Transform::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    let ticker = engine.weak();
    std::thread::Builder::new()
        .name("zipline-wasm-epoch".into())
        .spawn(move || {
            while let Some(engine) = ticker.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(TICK);
            }
        })
        .map_err(|e| wasmtime::format_err!("cannot start the epoch ticker thread: {e}"))?;
    Ok(Shared {
        engine,
        linker,
        compiled: Mutex::new(HashMap::new()),
    })
}

/// A transform component, compiled, linked and checked against the world, ready to be
/// instantiated any number of times.
pub struct Module {
    /// The file as the pipeline names it, for messages and log fields.
    pub(crate) name: Arc<str>,
    pub(crate) pre: TransformPre<HostState>,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Module {
    /// Reads, compiles (or loads from the compile cache), links and checks the component at
    /// `path`; `name` labels it in messages. `Err` says what is wrong, without the name.
    pub fn load(path: &Path, name: &str) -> Result<Arc<Module>, String> {
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Module::from_bytes(&bytes, name)
    }

    /// As [`Module::load`], from the component's bytes.
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Arc<Module>, String> {
        check_header(bytes)?;
        let shared = shared()?;
        let hash: [u8; 32] = Sha256::digest(bytes).into();
        let cached = lock(&shared.compiled).get(&hash).cloned();
        let component = match cached {
            Some(c) => c,
            None => {
                let c = cache::load_or_compile(&shared.engine, bytes, &hash)
                    .map_err(|e| format!("not a valid WebAssembly component: {e:#}"))?;
                lock(&shared.compiled).insert(hash, c.clone());
                c
            }
        };
        if let Some(other) = other_contract(&component, &shared.engine) {
            return Err(format!(
                "was built for {other}, but this Zipline implements {CONTRACT}: rebuild it \
                 against wit/transform.wit (guest-examples/README.md shows how)"
            ));
        }
        let pre = shared.linker.instantiate_pre(&component).map_err(|e| {
            format!(
                "imports something Zipline does not provide (a transform may import only \
                 zipline:transform/host and WASI): {e:#}"
            )
        })?;
        let pre = TransformPre::new(pre).map_err(|e| {
            format!(
                "does not implement the world zipline:transform/transform of {CONTRACT} \
                 (exports `init` and `transform`, see wit/transform.wit): {e:#}"
            )
        })?;
        Ok(Arc::new(Module {
            name: name.into(),
            pre,
        }))
    }
}

/// The `zipline:transform@<version>` a component imports, when it is not [`CONTRACT`]: a guest
/// built against an older (or newer) WIT would otherwise fail with wasmtime's message about a
/// missing import, which does not say what to do.
fn other_contract(component: &Component, engine: &Engine) -> Option<String> {
    let (package, version) = CONTRACT.split_once('@')?;
    component
        .component_type()
        .imports(engine)
        .find_map(|(name, _)| {
            let (interface, v) = name.split_once('@')?;
            let ours = interface.split_once('/')?.0 == package;
            (ours && v != version).then(|| format!("{package}@{v}"))
        })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Names the common ways a file is not a component before wasmtime's less direct messages.
fn check_header(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err("not a WebAssembly file (it does not start with the \\0asm header)".into());
    }
    // Core modules are version 1 with layer 0; components have layer 1.
    if bytes[4..8] == [1, 0, 0, 0] {
        return Err(
            "is a core WebAssembly module, not a component: wrap it with `wasm-tools component \
             new` (see guest-examples/README.md)"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_components_are_named_before_compiling() {
        assert!(
            check_header(b"hello world")
                .unwrap_err()
                .contains("not a WebAssembly file")
        );
        assert!(
            check_header(b"\0asm\x01\0\0\0")
                .unwrap_err()
                .contains("core WebAssembly module, not a component")
        );
        assert!(check_header(b"\0asm\x0d\0\x01\0").is_ok());
        let e = Module::from_bytes(b"\0asm\x0d\0\x01\0garbage", "x.wasm").unwrap_err();
        assert!(e.starts_with("not a valid WebAssembly component: "), "{e}");
    }
}
