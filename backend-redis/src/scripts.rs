//! The Lua operations, run as Redis Functions or, where a server has none, as scripts.
//!
//! **Functions (Redis ≥ 7.0).** `lua/lib.lua` and every operation form one library,
//! loaded once per server with `FUNCTION LOAD`; each call is an `FCALL`. The library's
//! helpers are then defined once per load, not once per call: that saves about 4 µs of
//! the server's time on every call (Findings 32 in docs/BENCHMARKS.md). The library's
//! name carries a hash of its source ([`LIBRARY`]), so two relayq versions on one
//! server each call their own functions. A server that lost the library (restarted
//! without persistence, `FUNCTION FLUSH`, a new cluster master) answers "Function not
//! found", and the caller loads it again: nothing ran, so the call is safe to repeat.
//!
//! **Scripts (Redis 6, or an ACL that refuses `FCALL` or `FUNCTION LOAD`).** Each
//! operation is the library followed by its body, sent with `EVALSHA`;
//! `redis::Script` loads it again on `NOSCRIPT`.

use std::sync::LazyLock;

use redis::Script;

/// One operation: its body, run after the library's `begin(KEYS, ARGV)`.
pub(crate) struct Op {
    /// The function's name: the library's name and the operation's.
    pub(crate) function: LazyLock<String>,
    /// The operation as a script, for servers without functions.
    pub(crate) script: LazyLock<Script>,
}

macro_rules! ops {
    ($($name:ident = $op:literal $(, $flag:literal)?;)*) => {
        $(
            pub(crate) static $name: Op = Op {
                function: LazyLock::new(|| format!("{}_{}", LIBRARY.name, $op)),
                script: LazyLock::new(|| {
                    Script::new(concat!(
                        include_str!("lua/lib.lua"),
                        "begin(KEYS, ARGV)\n",
                        include_str!(concat!("lua/", $op, ".lua")),
                    ))
                }),
            };
        )*

        /// Every operation: its name, body and function flags.
        const BODIES: &[(&str, &str, &str)] = &[
            $(($op, include_str!(concat!("lua/", $op, ".lua")), ops!(@flags $($flag)?)),)*
        ];
    };
    (@flags) => { "" };
    (@flags $flag:literal) => { $flag };
}

ops! {
    ENQUEUE = "enqueue";
    CLAIM = "claim";
    SETTLE = "settle";
    HEARTBEAT = "heartbeat";
    CANCEL = "cancel";
    BATCH = "batch";
    ADMIN = "admin";
    // Reads write nothing: the flag lets them run when the server is out of memory.
    READ = "read", "no-writes";
}

/// The functions library: its name and the source `FUNCTION LOAD` takes.
pub(crate) struct Library {
    /// `relayq_` and the first 16 hex digits of the SHA-1 of the library's Lua.
    pub(crate) name: String,
    pub(crate) source: String,
}

/// The library of this version of relayq.
pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let lib = include_str!("lua/lib.lua");
    let mut code = String::from(lib);
    for (op, body, flags) in BODIES {
        code.push_str(op);
        code.push_str(body);
        code.push_str(flags);
    }
    let name = format!("relayq_{}", &Script::new(&code).get_hash()[..16]);
    let mut source = format!("#!lua name={name}\n{lib}\n");
    for (op, body, flags) in BODIES {
        let flags = if flags.is_empty() {
            String::new()
        } else {
            format!(", flags = {{'{flags}'}}")
        };
        // The body keeps the names KEYS and ARGV: they are the callback's parameters.
        source.push_str(&format!(
            "redis.register_function{{function_name = '{name}_{op}', \
             callback = function(KEYS, ARGV)\nbegin(KEYS, ARGV)\n{body}\nend{flags}}}\n"
        ));
    }
    Library { name, source }
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_is_a_function_of_the_library() {
        assert!(LIBRARY.name.starts_with("relayq_"), "{}", LIBRARY.name);
        assert_eq!(LIBRARY.name.len(), "relayq_".len() + 16);
        for op in [
            &ENQUEUE, &CLAIM, &SETTLE, &HEARTBEAT, &CANCEL, &BATCH, &ADMIN, &READ,
        ] {
            let registered = format!("function_name = '{}'", *op.function);
            assert!(LIBRARY.source.contains(&registered), "{registered}");
        }
        assert_eq!(BODIES.len(), 8);
    }
}
