//! TLS for the tests: a throw-away certificate authority whose server certificate names
//! `127.0.0.1` (made with openssl's command line), and a node that serves TLS and requires it
//! of chosen roles (`hostssl` ... `trust`, `hostnossl` ... `reject` in its `pg_hba.conf`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::node::{make_base_dir, pg_user};
use crate::{HarnessError, Node, Result};

/// A certificate authority in a directory of its own (removed on drop), owned by the
/// `postgres` OS user so that a server's libpq can read its root certificate.
pub struct TestCa {
    dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| HarnessError::io("run openssl", e))?;
    if !out.status.success() {
        return Err(HarnessError::Other(format!(
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

impl TestCa {
    /// A new CA (`ca.crt`) and a server certificate for `127.0.0.1` it signed (`server.crt`,
    /// `server.key`), valid for two days.
    pub fn new(name: &str) -> Result<TestCa> {
        let (uid, gid) = pg_user()?;
        let dir = make_base_dir(name, uid, gid)?;
        let ca = TestCa { dir };
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        let mut root = vec!["req", "-x509", "-days", "2", "-subj", "/CN=tsoracle test CA"];
        root.extend(ec);
        root.extend(["-keyout", "ca.key", "-out", "ca.crt"]);
        openssl(&ca.dir, &root)?;
        let mut csr = vec!["req", "-subj", "/CN=127.0.0.1"];
        csr.extend(ec);
        csr.extend(["-keyout", "server.key", "-out", "server.csr"]);
        openssl(&ca.dir, &csr)?;
        fs::write(ca.dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n")
            .map_err(|e| HarnessError::io("write san.ext", e))?;
        openssl(
            &ca.dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "san.ext",
                "-out",
                "server.crt",
            ],
        )?;
        for f in ["ca.crt", "server.crt", "server.key"] {
            let path = ca.dir.join(f);
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                .map_err(|e| HarnessError::io(format!("chown {f}"), e))?;
        }
        Ok(ca)
    }

    /// The CA's certificate: a client's `sslrootcert`.
    pub fn root_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// `node` serves TLS with this CA's server certificate and admits `roles` over TLS only
    /// (reloaded; other roles as before).
    pub fn serve_tls(&self, node: &mut Node, roles: &[&str]) -> Result<()> {
        let (uid, gid) = pg_user()?;
        for f in ["server.crt", "server.key"] {
            let to = node.datadir().join(f);
            fs::copy(self.dir.join(f), &to)
                .map_err(|e| HarnessError::io(format!("copy {f}"), e))?;
            std::os::unix::fs::chown(&to, Some(uid), Some(gid))
                .map_err(|e| HarnessError::io(format!("chown {f}"), e))?;
            fs::set_permissions(&to, fs::Permissions::from_mode(0o600))
                .map_err(|e| HarnessError::io(format!("chmod {f}"), e))?;
        }
        let hba = node.datadir().join("pg_hba.conf");
        let old = fs::read_to_string(&hba).map_err(|e| HarnessError::io("read pg_hba.conf", e))?;
        let mut text = String::new();
        for role in roles {
            text.push_str(&format!("hostssl all {role} 127.0.0.1/32 trust\n"));
            text.push_str(&format!("hostnossl all {role} 127.0.0.1/32 reject\n"));
        }
        text.push_str(&old);
        fs::write(&hba, text).map_err(|e| HarnessError::io("write pg_hba.conf", e))?;
        node.set_conf("ssl", "on")?;
        node.set_conf("ssl_cert_file", "server.crt")?;
        node.set_conf("ssl_key_file", "server.key")?;
        node.reload()
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}
