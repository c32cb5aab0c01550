//! HTTP/1.0 requests to Patroni's REST API (and any loopback HTTP endpoint). See the [module documentation](super).

use super::*;

/// One HTTP/1.0 request to `127.0.0.1:port` (bounded by `timeout`): (status, body).
pub fn http(port: u16, method: &str, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| HarnessError::io(format!("connect {addr}"), e))?;
    s.set_read_timeout(Some(timeout)).map_err(|e| HarnessError::io("set_read_timeout", e))?;
    s.set_write_timeout(Some(timeout)).map_err(|e| HarnessError::io("set_write_timeout", e))?;
    write!(s, "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\r\n")
        .map_err(|e| HarnessError::io(format!("{method} {addr}{path}"), e))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| HarnessError::io(format!("read {addr}{path}"), e))?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| {
        HarnessError::Other(format!("{method} {addr}{path}: no HTTP status in {text:?}"))
    })?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}

/// The value of a top-level `"key": value` of a flat JSON object, as text (strings unquoted);
/// enough for Patroni's `GET /patroni` (`role`, `state`, `timeline`).
pub fn json_field(body: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\":");
    let rest = body[body.find(&pat)? + pat.len()..].trim_start();
    if let Some(s) = rest.strip_prefix('"') {
        return Some(s[..s.find('"')?].to_string());
    }
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim().to_string())
}
