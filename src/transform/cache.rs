//! On-disk cache of compiled components, so a restart does not recompile (a large interpreted
//! guest takes seconds to compile; loading its compiled form takes milliseconds).
//!
//! Entries are keyed by the SHA-256 of the component's bytes and the engine's compatibility
//! hash (wasmtime version, compiler settings, host CPU features), named
//! `<sha256>-<compat>.cwasm`, written to a temporary file and renamed into place, so readers
//! never see half an entry and concurrent writers of one entry are harmless. A stale or damaged
//! entry is recompiled and replaced.
//!
//! Loading a compiled artifact runs its machine code without validation, so the cache must be
//! writable only by Zipline's user: the directory is created `0700`, and an existing one that
//! belongs to someone else or is group- or world-writable is not used (with a warning).
//!
//! Location: `$ZIPLINE_TRANSFORM_CACHE`, else `$XDG_CACHE_HOME/zipline/transforms`, else
//! `~/.cache/zipline/transforms`. `ZIPLINE_TRANSFORM_CACHE=off` disables it.
//! See <https://docs.rs/wasmtime/48.0.8/wasmtime/component/struct.Component.html#method.deserialize>.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use wasmtime::Engine;
use wasmtime::component::Component;

/// The cache directory, if one is configured and safe to use.
fn dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = match std::env::var_os("ZIPLINE_TRANSFORM_CACHE") {
            Some(v) if v == "off" => return None,
            Some(v) if !v.is_empty() => PathBuf::from(v),
            _ => match (std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")) {
                (Some(x), _) if !x.is_empty() => PathBuf::from(x).join("zipline/transforms"),
                (_, Some(h)) if !h.is_empty() => PathBuf::from(h).join(".cache/zipline/transforms"),
                _ => return None,
            },
        };
        match prepare(&dir) {
            Ok(()) => Some(dir),
            Err(why) => {
                tracing::warn!(dir = %dir.display(), "not caching compiled transforms: {why}");
                None
            }
        }
    })
    .as_deref()
}

fn prepare(dir: &Path) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create it: {e}"))?;
    let meta = std::fs::metadata(dir).map_err(|e| format!("cannot inspect it: {e}"))?;
    if meta.permissions().mode() & 0o022 != 0 {
        return Err("it is writable by other users".into());
    }
    // /proc/self belongs to the process's effective user.
    if let Ok(me) = std::fs::metadata("/proc/self")
        && me.uid() != meta.uid()
    {
        return Err(format!(
            "it belongs to uid {}, not to this process's user",
            meta.uid()
        ));
    }
    Ok(())
}

fn entry(dir: &Path, engine: &Engine, hash: &[u8; 32]) -> PathBuf {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{hex}-{:016x}.cwasm", h.finish()))
}

/// The compiled form of `bytes` (whose SHA-256 is `hash`): from the cache when present and
/// loadable, else compiled now and stored.
pub(crate) fn load_or_compile(
    engine: &Engine,
    bytes: &[u8],
    hash: &[u8; 32],
) -> wasmtime::Result<Component> {
    match dir() {
        Some(dir) => load_or_compile_in(dir, engine, bytes, hash),
        None => Component::from_binary(engine, bytes),
    }
}

fn load_or_compile_in(
    dir: &Path,
    engine: &Engine,
    bytes: &[u8],
    hash: &[u8; 32],
) -> wasmtime::Result<Component> {
    let path = entry(dir, engine, hash);
    if path.exists() {
        match deserialize(engine, &path) {
            Ok(c) => return Ok(c),
            Err(e) => {
                tracing::warn!(entry = %path.display(), error = %e, "compiled transform cache entry unusable; recompiling");
            }
        }
    }
    let component = Component::from_binary(engine, bytes)?;
    if let Err(e) = store(&component, &path) {
        tracing::warn!(entry = %path.display(), error = %e, "cannot cache the compiled transform");
    }
    Ok(component)
}

/// Reads the entry into memory rather than mapping it (`deserialize_file` maps the file: an
/// entry truncated or rewritten in place while mapped would crash the process with SIGBUS).
#[allow(unsafe_code)]
fn deserialize(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    let bytes = std::fs::read(path)?;
    // SAFETY: the file was written by `store` below from a component this engine compiled
    // (its name carries the source's hash and the engine's compatibility hash), in a directory
    // only this user can write (checked in `prepare`); wasmtime itself refuses artifacts
    // built by an incompatible engine.
    unsafe { Component::deserialize(engine, &bytes) }
}

fn store(component: &Component, path: &Path) -> Result<(), String> {
    let bytes = component.serialize().map_err(|e| format!("{e:#}"))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        e.to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_directories_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let ok = tmp.path().join("a/b");
        prepare(&ok).unwrap();
        assert_eq!(
            std::fs::metadata(&ok).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(prepare(&open).unwrap_err(), "it is writable by other users");
    }

    /// A component exporting `run: func()` (tests/guests/wrong-world.wat).
    const TINY: &[u8] = &[
        0, 97, 115, 109, 13, 0, 1, 0, 1, 44, 0, 97, 115, 109, 1, 0, 0, 0, 1, 4, 1, 96, 0, 0, 3, 2,
        1, 0, 7, 7, 1, 3, 114, 117, 110, 0, 0, 10, 4, 1, 2, 0, 11, 0, 9, 4, 110, 97, 109, 101, 0,
        2, 1, 109, 2, 4, 1, 0, 0, 0, 7, 5, 1, 64, 0, 1, 0, 6, 9, 1, 0, 0, 1, 0, 3, 114, 117, 110,
        8, 6, 1, 0, 0, 0, 0, 0, 11, 9, 1, 0, 3, 114, 117, 110, 1, 0, 0, 0, 31, 14, 99, 111, 109,
        112, 111, 110, 101, 110, 116, 45, 110, 97, 109, 101, 1, 6, 0, 17, 1, 0, 1, 109, 1, 6, 0,
        18, 1, 0, 1, 105,
    ];

    #[test]
    fn compiled_components_are_stored_reloaded_and_replaced_when_damaged() {
        let tmp = tempfile::tempdir().unwrap();
        let engine = Engine::default();
        let hash = [7u8; 32];
        let path = entry(tmp.path(), &engine, &hash);
        let first = load_or_compile_in(tmp.path(), &engine, TINY, &hash).unwrap();
        let stored = std::fs::read(&path).unwrap();
        assert_eq!(stored, first.serialize().unwrap());
        // A second load comes from the file: make the file the only way to get it right.
        let again = load_or_compile_in(tmp.path(), &engine, b"not wasm at all", &hash).unwrap();
        assert_eq!(again.serialize().unwrap(), stored);
        // A damaged entry is recompiled and replaced.
        std::fs::write(&path, b"garbage").unwrap();
        load_or_compile_in(tmp.path(), &engine, TINY, &hash).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), stored);
        let leftovers: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary files left behind");
    }

    #[test]
    fn entries_are_named_by_content_and_engine() {
        let engine = Engine::default();
        let a = entry(Path::new("/c"), &engine, &[1; 32]);
        let b = entry(Path::new("/c"), &engine, &[2; 32]);
        assert_ne!(a, b);
        assert!(a.to_string_lossy().starts_with("/c/0101"));
        assert!(a.extension().is_some_and(|e| e == "cwasm"));
    }
}
