//! Where the relay is: the fleet's resolved timestamp it has emitted everything up to, and
//! how many bytes of the output file that took. Saved atomically (a new file renamed over the
//! old one, both synced), after the rows it covers are synced.

use crate::RelayError;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    /// Every row with a timestamp at or below this has been emitted.
    pub resolved: i64,
    /// The output file's length once those rows were written (0 for standard output).
    pub offset: u64,
}

impl Cursor {
    pub fn load(path: &Path) -> Result<Option<Cursor>, RelayError> {
        let text = match fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut parts = text.split_whitespace();
        let bad = || RelayError::Cursor(format!("{} is not a cursor: {text:?}", path.display()));
        let resolved = parts.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
        let offset = parts.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
        Ok(Some(Cursor { resolved, offset }))
    }

    pub fn save(&self, path: &Path) -> Result<(), RelayError> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".new");
        let tmp = Path::new(&tmp);
        {
            let mut f = File::create(tmp)?;
            writeln!(f, "{} {}", self.resolved, self.offset)?;
            f.sync_all()?;
        }
        fs::rename(tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// Open the output file for appending, cut back to what the cursor covers: rows written
/// after the cursor was last saved are written again, so none is there twice.
pub fn open_output(path: &Path, cursor: &Cursor) -> Result<File, RelayError> {
    let f = OpenOptions::new().create(true).append(true).open(path)?;
    let len = f.metadata()?.len();
    if len < cursor.offset {
        return Err(RelayError::Cursor(format!(
            "{} holds {len} bytes, fewer than the {} its cursor says were written: it is not the relay's output",
            path.display(),
            cursor.offset
        )));
    }
    f.set_len(cursor.offset)?;
    f.sync_all()?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_and_loaded_and_the_output_cut_back() {
        let dir =
            std::env::temp_dir().join(format!("tsoracle-relay-cursor-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let c = dir.join("out.cursor");
        assert_eq!(Cursor::load(&c).unwrap(), None);
        let at = Cursor { resolved: 42, offset: 6 };
        at.save(&c).unwrap();
        assert_eq!(Cursor::load(&c).unwrap(), Some(at));
        let out = dir.join("out");
        fs::write(&out, b"line1\nhalf-written").unwrap();
        drop(open_output(&out, &at).unwrap());
        assert_eq!(fs::read(&out).unwrap(), b"line1\n");
        assert!(open_output(&out, &Cursor { resolved: 1, offset: 99 }).is_err());
        fs::write(&c, "garbage").unwrap();
        assert!(Cursor::load(&c).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
