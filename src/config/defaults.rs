//! Default values for `#[serde(default = "...")]`, one generic function per type.

use std::time::Duration;

pub(crate) fn u16_<const N: u16>() -> u16 {
    N
}

pub(crate) fn u32_<const N: u32>() -> u32 {
    N
}

pub(crate) fn u64_<const N: u64>() -> u64 {
    N
}

pub(crate) fn usize_<const N: usize>() -> usize {
    N
}

pub(crate) fn secs<const N: u64>() -> Duration {
    Duration::from_secs(N)
}

pub(crate) fn millis<const N: u64>() -> Duration {
    Duration::from_millis(N)
}

pub(crate) fn yes() -> bool {
    true
}
