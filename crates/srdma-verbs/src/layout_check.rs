//! The layout tests' common part: one list of structs and fields gives both the C program
//! (sizeof, _Alignof, offsetof against the installed headers) and rustc's figures.

/// Expands a list of `struct NAME { field, ... }` (or `union`) into (rustc's lines, the C
/// program's printf calls). A field may be `rust_name = "c.path"` where the two differ, or a
/// nested path `a.b`.
#[macro_export]
#[doc(hidden)]
macro_rules! layout {
    ($( $kind:ident $s:ident { $( $f:ident $(. $g:ident)* $(= $c:literal)? ),* $(,)? } )*) => {{
        let mut rust: Vec<String> = Vec::new();
        let mut c = String::new();
        $(
            rust.push(format!(
                "{} size {} align {}",
                stringify!($s),
                std::mem::size_of::<$s>(),
                std::mem::align_of::<$s>()
            ));
            c += &format!(
                "printf(\"{s} size %zu align %zu\\n\", sizeof({k} {s}), _Alignof({k} {s}));\n",
                s = stringify!($s), k = stringify!($kind)
            );
            $(
                let cf = $crate::layout!(@c $f $(. $g)* $(, $c)?);
                rust.push(format!(
                    "{}.{} {}",
                    stringify!($s),
                    cf,
                    std::mem::offset_of!($s, $f $(. $g)*)
                ));
                c += &format!(
                    "printf(\"{s}.{f} %zu\\n\", offsetof({k} {s}, {f}));\n",
                    s = stringify!($s), f = cf, k = stringify!($kind)
                );
            )*
        )*
        (rust, c)
    }};
    (@c $f:ident $(. $g:ident)*) => { concat!(stringify!($f) $(, ".", stringify!($g))*) };
    (@c $f:ident $(. $g:ident)*, $c:literal) => { $c };
}

/// Compiles `c` (printf calls) with `headers` included, runs it and compares its lines with
/// `rust`, line by line; at least `min_lines` lines. Fails (or, with
/// `SRDMA_SKIP_VERBS_HEADERS=1`, skips) when a header is not installed.
pub(crate) fn compare(headers: &[&str], rust: &[String], c: &str, min_lines: usize) {
    for h in headers {
        if !std::path::Path::new("/usr/include").join(h).exists() {
            if std::env::var_os("SRDMA_SKIP_VERBS_HEADERS").is_some() {
                eprintln!("skipped: /usr/include/{h} is missing");
                return;
            }
            panic!(
                "/usr/include/{h} is missing: install libibverbs-dev and librdmacm-dev \
                 (apt-get install libibverbs-dev librdmacm-dev), or set \
                 SRDMA_SKIP_VERBS_HEADERS=1 to skip"
            );
        }
    }
    let dir = std::env::temp_dir().join(format!(
        "srdma-layout-{}-{}",
        std::process::id(),
        headers.join("_").replace(['/', '.'], "_")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let includes: String = headers
        .iter()
        .map(|h| format!("#include <{h}>\n"))
        .collect();
    std::fs::write(
        &src,
        format!("{includes}#include <stddef.h>\n#include <stdio.h>\nint main(void) {{\n{c}return 0;\n}}\n"),
    )
    .unwrap();
    let exe = dir.join("layout");
    let st = std::process::Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("running cc");
    assert!(st.success(), "compiling {}", src.display());
    let out = std::process::Command::new(&exe).output().unwrap();
    let c_lines: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(c_lines.len(), rust.len());
    for (r, c) in rust.iter().zip(&c_lines) {
        assert_eq!(r, c, "rustc says {r:?}, the C compiler {c:?}");
    }
    assert!(rust.len() >= min_lines, "{} lines checked", rust.len());
}
