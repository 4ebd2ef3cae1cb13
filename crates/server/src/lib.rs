//! placeholder
pub mod version;
