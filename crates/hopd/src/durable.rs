//! Files written so that a crash leaves either the old content or the new, never a torn one.

use std::io::Write;
use std::path::Path;

/// Write `bytes` to `path` durably: a temporary file beside it, fsync, rename over `path`,
/// then fsync of the directory so the rename itself survives a power loss.
pub fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(d) = path.parent() {
        std::fs::File::open(d)?.sync_all()?;
    }
    Ok(())
}
