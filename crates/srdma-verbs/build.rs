//! Symbol versions for libibverbs.so.1: one list (`symbols.txt`, taken from Debian bookworm's
//! libibverbs1 44.0-2 with `objdump -T`) gives both the linker's version script and the
//! `.symver` directives that bind each exported function to its node.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let list = std::fs::read_to_string(dir.join("symbols.txt")).unwrap();
    println!("cargo:rerun-if-changed=symbols.txt");

    // Nodes in the order rdma-core declares them; each inherits from the one before.
    let order = [
        "IBVERBS_1.0",
        "IBVERBS_1.1",
        "IBVERBS_1.5",
        "IBVERBS_1.6",
        "IBVERBS_1.7",
        "IBVERBS_1.8",
        "IBVERBS_1.9",
        "IBVERBS_1.10",
        "IBVERBS_1.11",
        "IBVERBS_1.12",
        "IBVERBS_1.13",
        "IBVERBS_1.14",
        "IBVERBS_PRIVATE_34",
        // librdmacm.so.1's nodes: the same file serves both names (see src/rdmacm/mod.rs).
        "RDMACM_1.0",
        "RDMACM_1.1",
        "RDMACM_1.2",
        "RDMACM_1.3",
        // srdma's own: the entry of the rsockets preload library (src/preload).
        "SRDMA_PRIVATE_1",
    ];
    // Bind only what the sources define (an assembler refuses a default version of an
    // undefined symbol); tests/exports.rs checks that every line of the list is exported.
    let mut sources = String::new();
    let mut dirs = vec![dir.join("src")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                sources += &std::fs::read_to_string(&p).unwrap();
            }
        }
    }
    println!("cargo:rerun-if-changed=src");
    let defined = |name: &str| {
        [
            format!("fn {name}("),
            format!("static mut {name}:"),
            format!("static {name}:"),
        ]
        .iter()
        .any(|pat| sources.contains(pat.as_str()))
    };
    let mut asm = String::new();
    let mut nodes: Vec<Vec<&str>> = vec![Vec::new(); order.len()];
    for line in list
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (name, ver) = (f[0], f[1]);
        let hidden = f.get(2) == Some(&"hidden");
        let i = order
            .iter()
            .position(|o| *o == ver)
            .unwrap_or_else(|| panic!("unknown version node {ver}"));
        nodes[i].push(name);
        if !defined(name) {
            continue;
        }
        let at = if hidden { "@" } else { "@@" };
        writeln!(asm, "    \".symver {name}, {name}{at}{ver}\",").unwrap();
    }
    let mut map = String::new();
    for (i, node) in order.iter().enumerate() {
        writeln!(map, "{node} {{").unwrap();
        if i == 0 {
            writeln!(map, "  local: *;").unwrap();
        }
        writeln!(
            map,
            "}}{};",
            // Each node inherits from the one before in its library.
            if i == 0 || node.starts_with("RDMACM_1.0") || node.starts_with("SRDMA_") {
                String::new()
            } else {
                format!(" {}", order[i - 1])
            }
        )
        .unwrap();
    }
    std::fs::write(out.join("libibverbs.map"), map).unwrap();
    std::fs::write(
        out.join("symver.rs"),
        if asm.is_empty() {
            String::new()
        } else {
            format!("std::arch::global_asm!(\n{asm});\n")
        },
    )
    .unwrap();
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        out.join("libibverbs.map").display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
