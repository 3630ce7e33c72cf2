//! `zipline transform new`: a new transform project in one of the SDKs' languages, written from
//! files built into the binary, so a project can be started without this repository.
//!
//! A project holds its language's template (`templates/transform/<language>/`: the transform
//! and `build.sh`), `templates/transform/test.sh` with a sample and its expected output, and,
//! under `zipline/`, the SDK and
//! the contract as this repository lays them out (`zipline/sdk/<language>/`,
//! `zipline/wit/transform.wit`), so the SDK's own build scripts work unchanged. The SDK is
//! copied, not referenced: the project builds with the contract of the `zipline` that made it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// A language an SDK exists for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// `sdk/rust`: the crate `zipline-transform`.
    Rust,
    /// `sdk/python`, built with componentize-py.
    Python,
    /// `sdk/js`, built with componentize-js.
    Js,
    /// `sdk/go`, mainline Go for wasip1.
    Go,
    /// `sdk/c`, one header over the contract's C bindings.
    C,
}

impl Language {
    /// Every language, in the order help texts list them.
    pub const ALL: [Language; 5] = [
        Language::Rust,
        Language::Python,
        Language::Js,
        Language::Go,
        Language::C,
    ];

    /// The name used on the command line and in the repository's directories.
    pub fn name(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::Python => "python",
            Language::Js => "js",
            Language::Go => "go",
            Language::C => "c",
        }
    }

    fn template(self) -> &'static [File] {
        match self {
            Language::Rust => files::RUST_TEMPLATE,
            Language::Python => files::PYTHON_TEMPLATE,
            Language::Js => files::JS_TEMPLATE,
            Language::Go => files::GO_TEMPLATE,
            Language::C => files::C_TEMPLATE,
        }
    }

    fn sdk(self) -> &'static [File] {
        match self {
            Language::Rust => files::RUST_SDK,
            Language::Python => files::PYTHON_SDK,
            Language::Js => files::JS_SDK,
            Language::Go => files::GO_SDK,
            Language::C => files::C_SDK,
        }
    }

    /// The Rust SDK reads the contract from its own `wit/` (a link to the repository's in the
    /// repository; a copy in a project).
    fn sdk_contract_copies(self) -> &'static [File] {
        match self {
            Language::Rust => files::RUST_SDK_CONTRACT,
            _ => &[],
        }
    }
}

/// The file a user edits in a new project of `language`.
pub fn source_file(language: Language) -> &'static str {
    match language {
        Language::Rust => "src/lib.rs",
        Language::Python => "app.py",
        Language::Js => "transform.js",
        Language::Go => "main.go",
        Language::C => "transform.c",
    }
}

/// Why a project could not be written. Nothing is left behind: a directory this call made is
/// removed again when writing into it fails.
#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    /// The name cannot serve as a directory, package and module name in every language.
    #[error(
        "transform name `{0}`: use a lowercase letter, then lowercase letters, digits and single \
         dashes (it names the directory, the package and the .wasm file)"
    )]
    Name(String),
    /// The directory exists: a project is never written over anything.
    #[error("{0} exists already; choose another name or directory")]
    Exists(PathBuf),
    /// Writing failed.
    #[error("cannot write {path}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// One embedded file: its path inside the project, where it comes from in the repository,
/// and its bytes.
struct File {
    path: &'static str,
    #[cfg(test)]
    source: &'static str,
    bytes: &'static [u8],
}

/// Writes a new project for `language` named `name` into `dir` (which must not exist yet) and
/// returns the paths written, relative to `dir`. In the template, `__NAME__` becomes `name`;
/// scripts (`*.sh`) are made executable.
pub fn create(language: Language, name: &str, dir: &Path) -> Result<Vec<String>, ProjectError> {
    check_name(name)?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(write_err(parent))?;
    }
    // create_dir, not create_dir_all: it fails on an existing directory, atomically.
    fs::create_dir(dir).map_err(|e| match e.kind() {
        io::ErrorKind::AlreadyExists => ProjectError::Exists(dir.to_owned()),
        _ => write_err(dir)(e),
    })?;
    let written = write_files(language, name, dir);
    if written.is_err() {
        // Only what this call wrote: the directory did not exist before.
        let _ = fs::remove_dir_all(dir);
    }
    written
}

/// A write error about `path`.
fn write_err(path: &Path) -> impl FnOnce(io::Error) -> ProjectError {
    let path = path.to_owned();
    move |source| ProjectError::Write { path, source }
}

/// The project's files, written into the new directory `dir`.
fn write_files(language: Language, name: &str, dir: &Path) -> Result<Vec<String>, ProjectError> {
    let templated = files::COMMON_TEMPLATE
        .iter()
        .chain(language.template())
        .map(|f| {
            let bytes = match std::str::from_utf8(f.bytes) {
                Ok(text) => text.replace("__NAME__", name).into_bytes(),
                Err(_) => f.bytes.to_vec(),
            };
            (f.path.to_owned(), bytes)
        });
    let vendored = language
        .sdk()
        .iter()
        .map(|f| (format!("zipline/{}", f.path), f.bytes.to_vec()));
    let contract = files::CONTRACT
        .iter()
        .chain(language.sdk_contract_copies())
        .map(|f| (f.path.to_owned(), f.bytes.to_vec()));
    let mut written = Vec::new();
    for (relative, bytes) in templated.chain(vendored).chain(contract) {
        let path = dir.join(&relative);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(write_err(parent))?;
        }
        fs::write(&path, bytes).map_err(write_err(&path))?;
        if relative.ends_with(".sh") {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
                .map_err(write_err(&path))?;
        }
        written.push(relative);
    }
    Ok(written)
}

fn check_name(name: &str) -> Result<(), ProjectError> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-')
        && !name.contains("--")
        && name.len() <= 64;
    if ok {
        Ok(())
    } else {
        Err(ProjectError::Name(name.to_owned()))
    }
}

/// The embedded files. Their lists are checked against the repository's directories by the
/// tests below, so a file added to an SDK or template cannot be left out of new projects.
mod files {
    use super::File;

    macro_rules! embed {
        ($($path:literal => $source:literal),* $(,)?) => {
            &[$(File {
                path: $path,
                #[cfg(test)]
                source: $source,
                bytes: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $source)),
            }),*]
        };
    }

    /// Paths in the repository, each kept at the same path under the project's `zipline/`.
    macro_rules! vendor {
        ($($path:literal),* $(,)?) => { embed!($($path => $path),*) };
    }

    pub(super) static CONTRACT: &[File] =
        embed!("zipline/wit/transform.wit" => "wit/transform.wit");
    pub(super) static RUST_SDK_CONTRACT: &[File] =
        embed!("zipline/sdk/rust/wit/transform.wit" => "wit/transform.wit");

    pub(super) static RUST_SDK: &[File] = vendor!(
        "sdk/rust/Cargo.lock",
        "sdk/rust/Cargo.toml",
        "sdk/rust/README.md",
        "sdk/rust/src/change.rs",
        "sdk/rust/src/lib.rs",
        "sdk/rust/src/tests.rs",
        "sdk/rust/src/value.rs",
    );
    pub(super) static PYTHON_SDK: &[File] = vendor!(
        "sdk/python/README.md",
        "sdk/python/test.sh",
        "sdk/python/test_zipline_transform.py",
        "sdk/python/zipline_transform.py",
    );
    pub(super) static JS_SDK: &[File] = vendor!(
        "sdk/js/README.md",
        "sdk/js/package.json",
        "sdk/js/test.sh",
        "sdk/js/test/hooks.js",
        "sdk/js/test/host.js",
        "sdk/js/test/zipline-transform.test.js",
        "sdk/js/zipline-transform.js",
    );
    pub(super) static GO_SDK: &[File] = vendor!(
        "sdk/go/.gitignore",
        "sdk/go/README.md",
        "sdk/go/build.sh",
        "sdk/go/change.go",
        "sdk/go/config.go",
        "sdk/go/deps.sh",
        "sdk/go/deps/Cargo.lock",
        "sdk/go/deps/Cargo.toml",
        "sdk/go/deps/lib.rs",
        "sdk/go/go.mod",
        "sdk/go/log_wasm.go",
        "sdk/go/out.go",
        "sdk/go/regen.sh",
        "sdk/go/test.sh",
        "sdk/go/transform.go",
        "sdk/go/transform_test.go",
        "sdk/go/value.go",
        "sdk/go/wit/WIT.sha256",
        "sdk/go/wit/export_wit_world/exports.go",
        "sdk/go/wit/wit_exports/wit_exports.go",
        "sdk/go/wit/wit_world/empty.s",
        "sdk/go/wit/wit_world/wit_bindings.go",
        "sdk/go/wit/zipline_transform_host/empty.s",
        "sdk/go/wit/zipline_transform_host/wit_bindings.go",
        "sdk/go/wit/zipline_transform_types/empty.s",
        "sdk/go/wit/zipline_transform_types/wit_bindings.go",
    );
    pub(super) static C_SDK: &[File] = vendor!(
        "sdk/c/README.md",
        "sdk/c/build.sh",
        "sdk/c/gen/WIT.sha256",
        "sdk/c/gen/transform.c",
        "sdk/c/gen/transform.h",
        "sdk/c/gen/transform_component_type.o",
        "sdk/c/impl/change.h",
        "sdk/c/impl/core.h",
        "sdk/c/regen.sh",
        "sdk/c/test.c",
        "sdk/c/test.sh",
        "sdk/c/zipline_transform.h",
    );

    /// What every language's project holds alike: the test script, and rust-filter's sample
    /// (every SDK's filter turns it into the same output, which `tests/transforms` checks).
    pub(super) static COMMON_TEMPLATE: &[File] = embed!(
        "test.sh" => "templates/transform/test.sh",
        "zipline/install.sh" => "templates/transform/install.sh",
        "sample.jsonl" => "guest-examples/rust-filter/sample.jsonl",
        "sample.config" => "guest-examples/rust-filter/sample.config",
        "expected.jsonl" => "guest-examples/rust-filter/expected.jsonl",
    );
    pub(super) static RUST_TEMPLATE: &[File] = embed!(
        ".gitignore" => "templates/transform/rust/.gitignore",
        "Cargo.lock" => "templates/transform/rust/Cargo.lock",
        "Cargo.toml" => "templates/transform/rust/Cargo.toml",
        "README.md" => "templates/transform/rust/README.md",
        "build.sh" => "templates/transform/rust/build.sh",
        "src/lib.rs" => "guest-examples/rust-filter/src/lib.rs",
    );
    pub(super) static PYTHON_TEMPLATE: &[File] = embed!(
        ".gitignore" => "templates/transform/python/.gitignore",
        "README.md" => "templates/transform/python/README.md",
        "app.py" => "templates/transform/python/app.py",
        "build.sh" => "templates/transform/python/build.sh",
    );
    pub(super) static JS_TEMPLATE: &[File] = embed!(
        ".gitignore" => "templates/transform/js/.gitignore",
        "README.md" => "templates/transform/js/README.md",
        "build.sh" => "templates/transform/js/build.sh",
        "componentize.mjs" => "templates/transform/js/componentize.mjs",
        "package-lock.json" => "templates/transform/js/package-lock.json",
        "package.json" => "templates/transform/js/package.json",
        "transform.js" => "templates/transform/js/transform.js",
    );
    pub(super) static GO_TEMPLATE: &[File] = embed!(
        ".gitignore" => "templates/transform/go/.gitignore",
        "README.md" => "templates/transform/go/README.md",
        "build.sh" => "templates/transform/go/build.sh",
        "go.mod" => "templates/transform/go/go.mod",
        "main.go" => "templates/transform/go/main.go",
    );
    pub(super) static C_TEMPLATE: &[File] = embed!(
        ".gitignore" => "templates/transform/c/.gitignore",
        "README.md" => "templates/transform/c/README.md",
        "build.sh" => "templates/transform/c/build.sh",
        "transform.c" => "templates/transform/c/transform.c",
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Files under `dir` (relative to the repository), skipping what builds and tests leave
    /// there and what git ignores.
    fn on_disk(dir: &str) -> BTreeSet<String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut found = BTreeSet::new();
        let mut stack = vec![root.join(dir)];
        while let Some(d) = stack.pop() {
            for entry in fs::read_dir(&d).unwrap() {
                let entry = entry.unwrap();
                let name = entry.file_name().into_string().unwrap();
                if matches!(
                    name.as_str(),
                    "third_party_pkg" | "node_modules" | "__pycache__" | "target"
                ) {
                    continue;
                }
                let path = entry.path();
                // The Rust SDK's `wit` is a link to the repository's contract.
                if fs::symlink_metadata(&path)
                    .unwrap()
                    .file_type()
                    .is_symlink()
                {
                    continue;
                }
                if path.is_dir() {
                    stack.push(path);
                } else {
                    let relative = path.strip_prefix(root).unwrap();
                    found.insert(relative.to_str().unwrap().to_owned());
                }
            }
        }
        found
    }

    #[test]
    fn every_sdk_file_is_embedded() {
        for language in Language::ALL {
            let embedded: BTreeSet<String> =
                language.sdk().iter().map(|f| f.path.to_owned()).collect();
            let dir = format!("sdk/{}", language.name());
            assert_eq!(embedded, on_disk(&dir), "the files of {dir}");
        }
    }

    #[test]
    fn every_template_file_is_embedded() {
        let embedded: BTreeSet<String> = Language::ALL
            .iter()
            .flat_map(|l| l.template())
            .chain(files::COMMON_TEMPLATE)
            .map(|f| f.source.to_owned())
            .filter(|source| source.starts_with("templates/"))
            .collect();
        assert_eq!(embedded, on_disk("templates/transform"));
    }

    #[test]
    fn names_that_cannot_name_a_package_are_refused() {
        for bad in ["", "My", "1x", "a_b", "a--b", "a-", "a b", "a/b", "ä"] {
            let e = check_name(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("`{bad}`")), "{e}");
        }
        for good in ["a", "mask-email", "f2"] {
            check_name(good).unwrap();
        }
    }

    #[test]
    fn a_project_is_never_written_over_anything() {
        let dir = std::env::temp_dir().join(format!("zipline-project-{}", std::process::id()));
        let project = dir.join("f");
        fs::create_dir_all(&project).unwrap();
        let e = create(Language::C, "f", &project).unwrap_err();
        assert!(
            matches!(e, ProjectError::Exists(ref p) if p == &project),
            "{e}"
        );
        assert_eq!(fs::read_dir(&project).unwrap().count(), 0);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_project_holds_its_template_the_sdk_and_the_contract() {
        let dir = std::env::temp_dir().join(format!("zipline-project-t-{}", std::process::id()));
        let project = dir.join("my-filter");
        let written = create(Language::Rust, "my-filter", &project).unwrap();
        for path in [
            "zipline/wit/transform.wit",
            "zipline/sdk/rust/wit/transform.wit",
            "zipline/sdk/rust/src/lib.rs",
        ] {
            assert!(written.iter().any(|w| w == path), "{path} in {written:?}");
        }
        let contract = fs::read(project.join("zipline/wit/transform.wit")).unwrap();
        assert_eq!(contract, include_bytes!("../../wit/transform.wit"));
        for f in Language::Rust.template() {
            let text = fs::read_to_string(project.join(f.path)).unwrap();
            assert!(!text.contains("__NAME__"), "{}", f.path);
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
