//! The Lua scripts, each the shared library followed by one operation. `redis::Script`
//! sends `EVALSHA` and, on `NOSCRIPT` (a restarted or flushed server), loads the script
//! and runs it again.

use std::sync::LazyLock;

use redis::Script;

macro_rules! script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(concat!(include_str!("lua/lib.lua"), include_str!($file)))
        });
    };
}

script!(ENQUEUE, "lua/enqueue.lua");
script!(CLAIM, "lua/claim.lua");
script!(SETTLE, "lua/settle.lua");
script!(HEARTBEAT, "lua/heartbeat.lua");
script!(CANCEL, "lua/cancel.lua");
script!(BATCH, "lua/batch.lua");
script!(ADMIN, "lua/admin.lua");
script!(READ, "lua/read.lua");
