//! Stream buffers shared by the packet-sequenced transports (HxH and ATP): the source's
//! segmentation and unacknowledged data ([`sendbuf`]), and the destination's in-order,
//! exactly-once delivery ([`reassembly`]); and the flows a transport remembers after their
//! state is gone ([`bounded`]).

pub(crate) mod bounded;
pub(crate) mod reassembly;
pub(crate) mod sendbuf;
