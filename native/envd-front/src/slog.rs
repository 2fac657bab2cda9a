//! The sandbox's log (envd's `GET /logs`), kept here for the sandbox's whole life: the front's
//! own lines, the processes it runs, and every line Node's envd writes (it sends them on its
//! stdout). One boot per front, so the daemon's cursor survives Node's sleeps.

use crate::json::{num, quote};
use crate::sys;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub const MAX_LINES: usize = 10_000;
pub const MAX_BYTES: usize = 1024 * 1024;
pub const LINE_MAX_BYTES: usize = 16 * 1024;
pub const MAX_WAIT_MS: u64 = 30_000;

struct Entry {
    seq: u64,
    at: u64,
    level: String,
    message: String,
    fields: Vec<(String, String)>,
}

struct Log {
    entries: VecDeque<Entry>,
    bytes: usize,
    next: u64,
}

pub struct SandboxLog {
    pub boot: String,
    log: Mutex<Log>,
    grew: Condvar,
}

pub fn log() -> &'static SandboxLog {
    static LOG: OnceLock<SandboxLog> = OnceLock::new();
    LOG.get_or_init(|| SandboxLog {
        boot: sys::uuid(),
        log: Mutex::new(Log {
            entries: VecDeque::new(),
            bytes: 0,
            next: 1,
        }),
        grew: Condvar::new(),
    })
}

fn cut(message: &str) -> String {
    if message.len() <= LINE_MAX_BYTES {
        return message.to_string();
    }
    let mut end = LINE_MAX_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

impl SandboxLog {
    pub fn write(&self, level: &str, message: &str, fields: Vec<(String, String)>) {
        self.write_at(sys::now_ms(), level, message, fields);
    }

    pub fn write_at(&self, at: u64, level: &str, message: &str, fields: Vec<(String, String)>) {
        let message = cut(message);
        let mut log = self.log.lock().unwrap();
        let seq = log.next;
        log.next += 1;
        log.bytes += message.len();
        log.entries.push_back(Entry {
            seq,
            at,
            level: level.to_string(),
            message,
            fields,
        });
        while log.entries.len() > MAX_LINES || (log.bytes > MAX_BYTES && log.entries.len() > 1) {
            if let Some(old) = log.entries.pop_front() {
                log.bytes -= old.message.len();
            }
        }
        self.grew.notify_all();
    }

    /// `{ boot, entries, dropped }` after `after`, waiting up to `wait_ms` for a line.
    pub fn since_json(&self, after: u64, wait_ms: u64) -> String {
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        let mut log = self.log.lock().unwrap();
        while wait_ms > 0 && log.entries.back().map(|e| e.seq).unwrap_or(0) <= after {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            log = self.grew.wait_timeout(log, deadline - now).unwrap().0;
        }
        let mut out = String::from("{\"boot\":");
        quote(&mut out, &self.boot);
        out.push_str(",\"entries\":[");
        let mut first_seq = None;
        for e in log.entries.iter().filter(|e| e.seq > after) {
            if first_seq.is_none() {
                first_seq = Some(e.seq);
            } else {
                out.push(',');
            }
            out.push_str(&format!("{{\"seq\":{},\"at\":{},\"level\":", e.seq, e.at));
            quote(&mut out, &e.level);
            out.push_str(",\"message\":");
            quote(&mut out, &e.message);
            out.push_str(",\"fields\":{");
            for (i, (k, v)) in e.fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                quote(&mut out, k);
                out.push(':');
                quote(&mut out, v);
            }
            out.push_str("}}");
        }
        let first = first_seq.unwrap_or(log.next);
        let dropped = first.saturating_sub(after).saturating_sub(1);
        out.push_str(&format!("],\"dropped\":{}}}", num(dropped as f64)));
        out
    }
}
