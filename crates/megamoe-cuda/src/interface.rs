//! The host/device interface declared once, in Rust: every kernel parameter struct, code and
//! constant that both sides use is declared here or in the crate that owns it, and the C++
//! declarations the kernels include are generated from those declarations.
//!
//! - [`device_struct!`](crate::device_struct) declares a `#[repr(C)]` struct; besides the Rust
//!   struct it gives its C++ declaration ([`DeviceStruct::declaration`]) with the struct's
//!   size and alignment asserted on the device side (`MEGAMOE_PARAMS_LAYOUT`).
//! - [`Item::constant`] and [`Item::enumeration`] turn Rust constants into C++ `constexpr`s and
//!   enums (the value is the Rust one; only the C++ name is written beside it).
//! - A [`GeneratedHeader`] is one embedded header made of such items. Each crate lists its own
//!   and checks them with [`check_headers`] in a test, which fails when a header in the tree is
//!   not what its declarations give; `MEGAMOE_WRITE_HEADERS=1` rewrites them.

use std::fmt::Write as _;
use std::path::Path;

use crate::tma::TensorMap;

/// A type a device struct's field may have: its C++ spelling.
pub trait DeviceType {
    /// The C++ declaration of a field `name` of this type (`u64 name`, `u64 name[8]`).
    fn field(name: &str) -> String {
        format!("{} {name}", Self::cpp_type())
    }
    /// The C++ type, qualified from the global namespace except for megamoe's integer types.
    fn cpp_type() -> String;
}

macro_rules! device_primitive {
    ($($t:ty => $cpp:literal),* $(,)?) => {
        $(impl DeviceType for $t {
            fn cpp_type() -> String {
                $cpp.to_string()
            }
        })*
    };
}

device_primitive!(
    u32 => "u32",
    u64 => "u64",
    i32 => "i32",
    i64 => "i64",
    f32 => "float",
    TensorMap => "megamoe::ptx::TensorMap",
);

impl<T: DeviceType, const N: usize> DeviceType for [T; N] {
    fn field(name: &str) -> String {
        T::field(&format!("{name}[{N}]"))
    }
    fn cpp_type() -> String {
        panic!("a C++ array is only a field's type")
    }
}

/// A struct declared with [`device_struct!`](crate::device_struct).
pub trait DeviceStruct {
    /// Its C++ declaration.
    fn declaration() -> Item;
}

/// One field of a device struct.
#[derive(Debug, Clone)]
pub struct Field {
    pub docs: &'static [&'static str],
    /// The C++ declaration (`u64 name`).
    pub decl: String,
}

/// One declaration of a generated header.
#[derive(Debug, Clone)]
pub enum Item {
    Struct {
        docs: &'static [&'static str],
        name: &'static str,
        /// `alignas` beyond the fields' own (the Rust struct's `align(N)`).
        align: Option<usize>,
        fields: Vec<Field>,
        size: usize,
        align_of: usize,
    },
    Enum {
        doc: &'static str,
        name: &'static str,
        repr: &'static str,
        /// C++ name, value, comment.
        values: Vec<(&'static str, i64, &'static str)>,
    },
    Const {
        doc: &'static str,
        name: &'static str,
        cpp_type: &'static str,
        value: String,
    },
}

impl Item {
    /// `constexpr cpp_type name = value;`
    pub fn constant(
        doc: &'static str,
        name: &'static str,
        cpp_type: &'static str,
        value: impl std::fmt::Display,
    ) -> Item {
        Item::Const {
            doc,
            name,
            cpp_type,
            value: value.to_string(),
        }
    }

    /// `enum name : repr { values };` from values given as Rust constants.
    pub fn enumeration(
        doc: &'static str,
        name: &'static str,
        repr: &'static str,
        values: &[(&'static str, i64)],
    ) -> Item {
        Item::Enum {
            doc,
            name,
            repr,
            values: values.iter().map(|&(n, v)| (n, v, "")).collect(),
        }
    }

    /// The enum of a crate's device waits: `cpp_names[i]` is wait `waits.first + i`, commented
    /// with its name in `waits`.
    pub fn waits(
        doc: &'static str,
        name: &'static str,
        waits: &crate::WaitNames,
        cpp_names: &[&'static str],
    ) -> Item {
        assert_eq!(
            waits.names.len(),
            cpp_names.len(),
            "{name}: one C++ name per wait"
        );
        let values = cpp_names
            .iter()
            .zip(waits.names)
            .enumerate()
            .map(|(i, (&n, &what))| (n, (waits.first + i as u32) as i64, what))
            .collect();
        Item::Enum {
            doc,
            name,
            repr: "u32",
            values,
        }
    }

    fn render(&self, out: &mut String) {
        match self {
            Item::Struct {
                docs,
                name,
                align,
                fields,
                size,
                align_of,
            } => {
                comment(out, "", docs);
                let align = align.map_or(String::new(), |a| format!("alignas({a}) "));
                let _ = writeln!(out, "struct {align}{name} {{");
                for f in fields {
                    comment(out, "    ", f.docs);
                    let _ = writeln!(out, "    {};", f.decl);
                }
                let _ = writeln!(out, "}};");
                let _ = writeln!(out, "MEGAMOE_PARAMS_LAYOUT({name}, {size}, {align_of});");
            }
            Item::Enum {
                doc,
                name,
                repr,
                values,
            } => {
                comment(out, "", &[doc]);
                let _ = writeln!(out, "enum {name} : {repr} {{");
                for (n, v, what) in values {
                    let value = if *v >= 0x100 {
                        format!("{v:#x}")
                    } else {
                        v.to_string()
                    };
                    let what = if what.is_empty() {
                        String::new()
                    } else {
                        format!("  // {what}")
                    };
                    let _ = writeln!(out, "    {n} = {value},{what}");
                }
                let _ = writeln!(out, "}};");
            }
            Item::Const {
                doc,
                name,
                cpp_type,
                value,
            } => {
                comment(out, "", &[doc]);
                let _ = writeln!(out, "constexpr {cpp_type} {name} = {value};");
            }
        }
    }
}

fn comment(out: &mut String, indent: &str, lines: &[&str]) {
    for line in lines
        .iter()
        .flat_map(|l| l.split('\n'))
        .filter(|l| !l.is_empty())
    {
        // Rust doc links read as plain code names.
        let line = line.trim_end().replace("[`", "`").replace("`]", "`");
        let _ = writeln!(out, "{indent}//{line}");
    }
}

/// One generated header: `path` below the crate's `device/` folder.
#[derive(Debug, Clone)]
pub struct GeneratedHeader {
    pub path: &'static str,
    /// The Rust file that lists its items, from the repository's root (`file!()`).
    pub source: &'static str,
    /// What the header is, one or more comment lines.
    pub about: &'static [&'static str],
    pub includes: &'static [&'static str],
    pub namespace: &'static str,
    /// Lines that open the namespace's body (aliases the crate's other headers rely on).
    pub preamble: &'static [&'static str],
    pub items: Vec<Item>,
}

/// The environment variable that makes [`check_headers`] rewrite stale headers.
pub const WRITE_HEADERS: &str = "MEGAMOE_WRITE_HEADERS";

impl GeneratedHeader {
    /// The header's text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "// Generated from {} (do not edit: `{WRITE_HEADERS}=1 cargo test` rewrites it).",
            self.source
        );
        comment(&mut out, "", self.about);
        let _ = writeln!(out, "#pragma once");
        let _ = writeln!(out, "#include <megamoe/common.cuh>");
        for inc in self.includes {
            let _ = writeln!(out, "#include <{inc}>");
        }
        let _ = writeln!(out, "\nnamespace {} {{", self.namespace);
        for line in self.preamble {
            let _ = writeln!(out, "{line}");
        }
        let mut body = String::new();
        for item in &self.items {
            body.push('\n');
            item.render(&mut body);
        }
        // Names of this namespace are written unqualified, megamoe's relative to megamoe.
        body = body.replace(&format!(" {}::", self.namespace), " ");
        if self.namespace.starts_with("megamoe::") {
            body = body.replace(" megamoe::", " ");
        }
        out.push_str(&body);
        let _ = writeln!(out, "\n}}  // namespace {}", self.namespace);
        out
    }
}

/// Compares every header of `headers` with its file below `<crate_dir>/device/`; with
/// `MEGAMOE_WRITE_HEADERS=1` rewrites those that differ, else panics naming them.
pub fn check_headers(crate_dir: &str, headers: &[GeneratedHeader]) {
    let write = std::env::var(WRITE_HEADERS).is_ok_and(|v| v == "1");
    let stale = stale_headers(Path::new(crate_dir), headers, write);
    assert!(
        stale.is_empty(),
        "generated headers differ from their Rust declarations: {stale:?}; \
         `{WRITE_HEADERS}=1 cargo test --workspace generated_headers` rewrites them"
    );
}

/// The files of `headers` that differ from their text, rewritten when `write` (then none is
/// returned).
fn stale_headers(crate_dir: &Path, headers: &[GeneratedHeader], write: bool) -> Vec<String> {
    let mut stale = Vec::new();
    for h in headers {
        let path = crate_dir.join("device").join(h.path);
        let text = h.render();
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            continue;
        }
        if write {
            std::fs::write(&path, &text)
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        } else {
            stale.push(path.display().to_string());
        }
    }
    stale
}

/// Declares a `#[repr(C)]` struct shared with the kernels: the Rust struct (plain data,
/// [`Pod`](crate::Pod)) and its [`DeviceStruct`] declaration, doc comments included.
///
/// ```ignore
/// megamoe_cuda::device_struct! {
///     #[device(namespace = "megamoe::gemm")]
///     /// Docs of the struct.
///     #[repr(C, align(64))]
///     #[derive(Clone, Copy, Debug)]
///     pub struct Params {
///         /// Docs of the field.
///         pub k: u32,
///     }
/// }
/// ```
///
/// `#[device(namespace = "...", declared_as = "Name")]`: the C++ struct is declared as `Name`
/// and used (as a field of another) under the Rust name, which the device code defines (for
/// instance as a struct deriving from `Name` with member functions).
#[macro_export]
macro_rules! device_struct {
    (
        #[device(namespace = $ns:literal $(, declared_as = $declared:literal)?)]
        $(#[doc = $doc:literal])*
        #[repr(C $(, align($align:literal))?)]
        $(#[$attr:meta])*
        pub struct $name:ident {
            $(
                $(#[doc = $fdoc:literal])*
                pub $field:ident : $ty:ty
            ),* $(,)?
        }
    ) => {
        $(#[doc = $doc])*
        #[repr(C $(, align($align))?)]
        $(#[$attr])*
        pub struct $name {
            $(
                $(#[doc = $fdoc])*
                pub $field: $ty,
            )*
        }

        impl $crate::interface::DeviceType for $name {
            fn cpp_type() -> String {
                format!("{}::{}", $ns, stringify!($name))
            }
        }

        impl $crate::interface::DeviceStruct for $name {
            fn declaration() -> $crate::interface::Item {
                let name = stringify!($name);
                $(let name = $declared;)?
                $crate::interface::Item::Struct {
                    docs: &[$($doc),*],
                    name,
                    align: None $(.or(Some($align)))?,
                    fields: vec![$($crate::interface::Field {
                        docs: &[$($fdoc),*],
                        decl: <$ty as $crate::interface::DeviceType>::field(stringify!($field)),
                    }),*],
                    size: ::std::mem::size_of::<$name>(),
                    align_of: ::std::mem::align_of::<$name>(),
                }
            }
        }

        // SAFETY: `#[repr(C)]` and every field a device type: integers, floats, tensor maps,
        // arrays of them or other such structs.
        unsafe impl $crate::Pod for $name where $($ty: $crate::Pod),* {}
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::device_struct! {
        #[device(namespace = "megamoe::test")]
        /// An example.
        #[repr(C, align(16))]
        #[derive(Clone, Copy)]
        pub struct Example {
            /// Its address.
            pub ptr: u64,
            pub peers: [u64; 2],
            pub k: u32,
        }
    }

    #[test]
    fn a_header_declares_each_item_with_its_layout() {
        let h = GeneratedHeader {
            path: "x.cuh",
            source: "src/interface.rs",
            about: &[" An example."],
            includes: &["megamoe/ptx/tma.cuh"],
            namespace: "megamoe::test",
            preamble: &[],
            items: vec![
                Item::constant(" Threads.", "kThreads", "u32", 384),
                Item::enumeration(" Codes.", "Code", "u32", &[("kOk", 0), ("kBad", 2)]),
                Example::declaration(),
            ],
        };
        let text = h.render();
        let expected = "\
// Generated from src/interface.rs (do not edit: `MEGAMOE_WRITE_HEADERS=1 cargo test` rewrites it).
// An example.
#pragma once
#include <megamoe/common.cuh>
#include <megamoe/ptx/tma.cuh>

namespace megamoe::test {

// Threads.
constexpr u32 kThreads = 384;

// Codes.
enum Code : u32 {
    kOk = 0,
    kBad = 2,
};

// An example.
struct alignas(16) Example {
    // Its address.
    u64 ptr;
    u64 peers[2];
    u32 k;
};
MEGAMOE_PARAMS_LAYOUT(Example, 32, 16);

}  // namespace megamoe::test
";
        assert_eq!(text, expected);
    }

    #[test]
    fn a_stale_header_is_named_and_rewritten_on_request() {
        let dir = std::env::temp_dir().join(format!("megamoe-interface-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("device")).unwrap();
        let h = GeneratedHeader {
            path: "x.cuh",
            source: "src/interface.rs",
            about: &[],
            includes: &[],
            namespace: "megamoe::test",
            preamble: &[],
            items: vec![Example::declaration()],
        };
        let file = dir.join("device/x.cuh");
        std::fs::write(&file, "struct Example { u64 ptr; };\n").unwrap();
        let headers = [h];
        assert_eq!(
            stale_headers(&dir, &headers, false),
            [file.display().to_string()]
        );
        assert!(stale_headers(&dir, &headers, true).is_empty());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), headers[0].render());
        assert!(stale_headers(&dir, &headers, false).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nested_structs_are_named_from_their_namespace() {
        assert_eq!(Example::cpp_type(), "megamoe::test::Example");
        assert_eq!(<[Example; 3]>::field("e"), "megamoe::test::Example e[3]");
        assert_eq!(<[[u64; 3]; 2]>::field("wg"), "u64 wg[2][3]");
    }
}
