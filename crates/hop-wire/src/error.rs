use thiserror::Error;

/// Why a datagram could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Error {
    #[error("datagram too short: need {needed} bytes, have {have}")]
    Truncated { needed: usize, have: usize },
    #[error("bad magic 0x{0:04x} (not a Hop datagram)")]
    BadMagic(u16),
    #[error("unsupported wire version {0}")]
    UnsupportedVersion(u8),
    #[error("unknown transport id {0}")]
    UnknownTransport(u8),
    #[error("integrity check failed (crc32c)")]
    BadChecksum,
    #[error("reserved bits set: {0:#x}")]
    ReservedBits(u32),
    #[error("unknown message type {0}")]
    UnknownMessageType(u8),
    #[error("malformed field {field}: {reason}")]
    Malformed {
        field: &'static str,
        reason: &'static str,
    },
    #[error("length mismatch: header says {declared}, datagram has {actual}")]
    LengthMismatch { declared: usize, actual: usize },
}
