//! The few C calls std does not wrap, and small formats (base64, ISO time, a UUID).

use std::io::Read;
use std::time::{SystemTime, UNIX_EPOCH};

extern "C" {
    #[link_name = "poll"]
    fn c_poll(fds: *mut PollFd, n: u64, timeout: i32) -> i32;
    #[link_name = "read"]
    fn c_read(fd: i32, buf: *mut u8, n: usize) -> isize;
    #[link_name = "close"]
    fn c_close(fd: i32) -> i32;
    fn kill(pid: i32, sig: i32) -> i32;
    fn setsid() -> i32;
    fn getuid() -> u32;
    fn mallopt(param: i32, value: i32) -> i32;
}

/// struct pollfd.
#[repr(C)]
pub struct PollFd {
    pub fd: i32,
    pub events: i16,
    pub revents: i16,
}

pub const POLLIN: i16 = 1;
pub const POLLERR: i16 = 8;
pub const POLLHUP: i16 = 0x10;

/// poll(2) on `fds` for up to `timeout` ms (-1: no limit); negative on an error (EINTR).
pub fn poll(fds: &mut [PollFd], timeout: i32) -> i32 {
    // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs for the call's duration.
    unsafe { c_poll(fds.as_mut_ptr(), fds.len() as u64, timeout) }
}

/// read(2) into `buf`.
pub fn read(fd: i32, buf: &mut [u8]) -> isize {
    // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
    unsafe { c_read(fd, buf.as_mut_ptr(), buf.len()) }
}

/// close(2) of a descriptor this process owns and no longer uses.
pub fn close(fd: i32) {
    // SAFETY: the caller owns `fd` (taken with into_raw_fd) and drops it here once.
    unsafe {
        c_close(fd);
    }
}

/// Whether the last call failed with EINTR or EAGAIN.
pub fn interrupted() -> bool {
    matches!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(4) | Some(11)
    )
}

/// Signals a whole process group; false when it is gone (ESRCH). EPERM counts as alive.
pub fn kill_group(pgid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) with a negative pid names a process group; it touches no memory of ours.
    let r = unsafe { kill(-pgid, sig) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(1)
}

/// Signals one process.
pub fn kill_one(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a pid of our own child; it touches no memory of ours.
    unsafe {
        kill(pid, sig);
    }
}

/// A new session (and process group) for the child being set up: what Node's `detached` does.
pub fn new_session() -> std::io::Result<()> {
    // SAFETY: setsid(2) in the forked child before exec; async-signal-safe.
    if unsafe { setsid() } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub fn uid() -> u32 {
    // SAFETY: getuid(2) cannot fail.
    unsafe { getuid() }
}

/// One malloc arena for the whole process: threads here are few and mostly waiting, and each
/// arena of its own would keep pages.
pub fn one_arena() {
    // SAFETY: mallopt(M_ARENA_MAX, 1) before any thread starts.
    unsafe {
        mallopt(-8, 1);
    }
}

pub const SIGNALS: &[(&str, i32)] = &[
    ("SIGHUP", 1),
    ("SIGINT", 2),
    ("SIGQUIT", 3),
    ("SIGILL", 4),
    ("SIGTRAP", 5),
    ("SIGABRT", 6),
    ("SIGIOT", 6),
    ("SIGBUS", 7),
    ("SIGFPE", 8),
    ("SIGKILL", 9),
    ("SIGUSR1", 10),
    ("SIGSEGV", 11),
    ("SIGUSR2", 12),
    ("SIGPIPE", 13),
    ("SIGALRM", 14),
    ("SIGTERM", 15),
    ("SIGSTKFLT", 16),
    ("SIGCHLD", 17),
    ("SIGCONT", 18),
    ("SIGSTOP", 19),
    ("SIGTSTP", 20),
    ("SIGTTIN", 21),
    ("SIGTTOU", 22),
    ("SIGURG", 23),
    ("SIGXCPU", 24),
    ("SIGXFSZ", 25),
    ("SIGVTALRM", 26),
    ("SIGPROF", 27),
    ("SIGWINCH", 28),
    ("SIGIO", 29),
    ("SIGPOLL", 29),
    ("SIGPWR", 30),
    ("SIGSYS", 31),
];

pub fn signal_name(n: i32) -> Option<&'static str> {
    SIGNALS.iter().find(|(_, v)| *v == n).map(|(name, _)| *name)
}

/// A signal by name as envd's `signalOf` takes it (`TERM`, `sigterm`, `SIGTERM`).
pub fn signal_number(name: &str) -> Option<i32> {
    let upper = name.to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{}", upper)
    };
    SIGNALS.iter().find(|(n, _)| *n == full).map(|(_, v)| *v)
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

pub fn base64(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Strict base64 (padded, as envd's stdin route accepts it); None for anything else.
pub fn unbase64(text: &str) -> Option<Vec<u8>> {
    let b = text.as_bytes();
    if !b.len().is_multiple_of(4) {
        return None;
    }
    let val = |c: u8| B64.iter().position(|&x| x == c).map(|p| p as u32);
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for (i, q) in b.chunks(4).enumerate() {
        let last = i == b.len() / 4 - 1;
        let pad = q.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for (j, &c) in q.iter().enumerate() {
            let v = if j >= 4 - pad { 0 } else { val(c)? };
            n = n << 6 | v;
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `ms` since the epoch as `Date.prototype.toISOString` writes it.
pub fn iso(ms: u64) -> String {
    let days = (ms / 86_400_000) as i64;
    let rem = ms % 86_400_000;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        y,
        m,
        d,
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

/// A version 4 UUID from /dev/urandom.
pub fn uuid() -> String {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    if b == [0u8; 16] {
        // No /dev/urandom: the time and pid still tell two boots apart.
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        b[..8].copy_from_slice(&(t as u64).to_le_bytes());
        b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{:02x}", x)).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Constant-time equality of a presented token with the expected one (as envd's `sameSecret`):
/// every byte of `expected` is compared whatever `given` holds.
pub fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = (given.len() ^ expected.len()) as u64;
    for (i, &e) in expected.iter().enumerate() {
        diff |= (e ^ given.get(i).copied().unwrap_or(0)) as u64;
    }
    diff == 0 && !expected.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn formats() {
        assert_eq!(base64(b"hi\xff"), "aGn/");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(unbase64("YQ==").unwrap(), b"a");
        assert_eq!(unbase64("aGn/").unwrap(), b"hi\xff");
        assert!(unbase64("YQ=").is_none());
        assert!(unbase64("Y===").is_none());
        assert_eq!(iso(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso(1_796_667_296_123), "2026-12-07T18:14:56.123Z");
        assert_eq!(signal_number("term"), Some(15));
        assert_eq!(signal_name(9), Some("SIGKILL"));
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"ab", b"abc"));
        assert!(!same_secret(b"abcd", b"abc"));
        assert!(!same_secret(b"", b""));
        assert_eq!(uuid().len(), 36);
    }
}
