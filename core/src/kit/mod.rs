//! The backend kit: what every backend would otherwise write again. Statement templates
//! for a validated schema ([`Statements`]), schema versions ([`schema`]), relayq's URL
//! options ([`url_options`]), a bounded first connection ([`probe`]), wake-up messages
//! and their listening task ([`wake`]), a fire's judgement ([`fire`]), a claim's admission under limit keys ([`keys`]) and under a rate ([`rate`]), the claim's refill ([`claim_refilling`]), a purge in
//! steps ([`purge`]), dependencies' checks and edges ([`after`]); with [`retry::Policy`](crate::retry::Policy)
//! for retries and [`listing`](crate::listing) for batch listings.

pub mod after;
mod claim;
pub mod fire;
pub mod keys;
mod probe;
pub mod purge;
pub mod rate;
pub mod schema;
mod statements;
pub mod url_options;
pub mod wake;

pub use claim::claim_refilling;
pub use probe::{CONNECT_TIMEOUT, probe};
pub use statements::Statements;
