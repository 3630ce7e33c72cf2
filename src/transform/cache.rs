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
//! See <https://docs.rs/wasmtime/48.0.8/wasmtime/component/struct.Component.html#method.deserialize_file>.

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
    let Some(dir) = dir() else {
        return Component::from_binary(engine, bytes);
    };
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

#[allow(unsafe_code)]
fn deserialize(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // SAFETY: the file was written by `store` below from a component this engine compiled
    // (its name carries the source's hash and the engine's compatibility hash), in a directory
    // only this user can write (checked in `prepare`); wasmtime itself refuses artifacts
    // built by an incompatible engine.
    unsafe { Component::deserialize_file(engine, path) }
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
