//! The backend kit: what every backend would otherwise write again. Statement templates
//! for a validated schema ([`Statements`]), relayq's URL options ([`url_options`]), a
//! bounded first connection ([`probe`]); with [`retry::Policy`](crate::retry::Policy)
//! for retries and [`listing`](crate::listing) for batch listings.

mod claim;
mod probe;
mod statements;
pub mod url_options;

pub use claim::claim_refilling;
pub use probe::{CONNECT_TIMEOUT, probe};
pub use statements::Statements;
