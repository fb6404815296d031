//! The cases, one module per SPEC section. Each case cites its rule.

pub mod enqueue;
