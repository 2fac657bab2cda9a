//! The processes the front runs (envd's `POST /exec` while Node's envd sleeps): each in a session
//! of its own, stdout and stderr kept apart and together, followed as NDJSON events exactly as
//! envd's process table and `processEvents` give them (runtime/server/process-table.ts,
//! runtime/envd/process-events.ts).

use crate::json::{num, quote, quoted};
use crate::slog::{self, log};
use crate::sys;
use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::os::fd::IntoRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// What each stream's own log keeps (envd's STREAM_LOG_BYTES), and the interleaved one.
const STREAM_LOG_BYTES: usize = 16 * 1024 * 1024;
const OUTPUT_LOG_BYTES: usize = 8 * 1024 * 1024;
const COALESCE_BYTES: usize = 8 * 1024;
/// Finished processes kept for replay (envd's FINISHED_KEPT).
const FINISHED_KEPT: usize = 32;
/// Largest `data` of one event, and how often a silent followed process gets a keepalive.
const EVENT_BYTES: usize = 64 * 1024;
pub const KEEPALIVE: Duration = Duration::from_secs(5);
/// Small stacks: these threads only copy bytes and wait.
pub const STACK: usize = 64 * 1024;

pub struct OutLog {
    chunks: VecDeque<Vec<u8>>,
    held: usize,
    base: u64,
    cap: usize,
    pub done: bool,
}

impl OutLog {
    fn new(cap: usize) -> Self {
        OutLog {
            chunks: VecDeque::new(),
            held: 0,
            base: 0,
            cap,
            done: false,
        }
    }
    pub fn end(&self) -> u64 {
        self.base + self.held as u64
    }
    pub fn start(&self) -> u64 {
        self.base
    }
    fn append(&mut self, data: &[u8]) {
        match self.chunks.back_mut() {
            Some(last) if last.len() + data.len() <= COALESCE_BYTES => last.extend_from_slice(data),
            _ => self.chunks.push_back(data.to_vec()),
        }
        self.held += data.len();
        while self.held > self.cap && self.chunks.len() > 1 {
            let old = self.chunks.pop_front().unwrap();
            self.held -= old.len();
            self.base += old.len() as u64;
        }
    }
    /// Up to `max` bytes from `offset` (or the oldest held), and the offset they start at.
    pub fn read(&self, offset: u64, max: usize) -> (Vec<u8>, u64) {
        let start = offset.max(self.base);
        let mut out = Vec::new();
        let mut at = self.base;
        for chunk in &self.chunks {
            if out.len() >= max {
                break;
            }
            let end = at + chunk.len() as u64;
            if end > start {
                let part = &chunk[(start.saturating_sub(at)) as usize..];
                let take = part.len().min(max - out.len());
                out.extend_from_slice(&part[..take]);
            }
            at = end;
        }
        (out, start.min(self.end()))
    }
}

pub struct State {
    pub output: OutLog,
    pub stdout: OutLog,
    pub stderr: OutLog,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
}

pub struct Proc {
    pub id: String,
    pub pid: i32,
    pub command: String,
    pub cwd: String,
    pub started_at: String,
    pub state: Mutex<State>,
    pub changed: Condvar,
    pub stdin: Mutex<Option<ChildStdin>>,
}

impl Proc {
    pub fn info_json(&self) -> String {
        let s = self.state.lock().unwrap();
        let mut o = format!(
            "{{\"id\":{},\"pid\":{},\"command\":",
            quoted(&self.id),
            self.pid
        );
        quote(&mut o, &self.command);
        o.push_str(",\"cwd\":");
        quote(&mut o, &self.cwd);
        o.push_str(&format!(
            ",\"started_at\":\"{}\",\"running\":{},\"exit_code\":{},\"signal\":{},\"output_bytes\":{}}}",
            self.started_at,
            !s.output.done,
            s.code.map(|c| c.to_string()).unwrap_or_else(|| "null".into()),
            signal_json(s.signal),
            num(s.output.end() as f64)
        ));
        o
    }
}

fn signal_json(signal: Option<i32>) -> String {
    match signal.and_then(sys::signal_name) {
        Some(name) => quoted(name),
        None => "null".into(),
    }
}

pub struct Table {
    procs: Mutex<TableInner>,
}

struct TableInner {
    by_id: HashMap<String, Arc<Proc>>,
    order: Vec<String>,
    finished: Vec<String>,
}

/// What to start.
pub struct Spec {
    pub program: String,
    pub args: Vec<String>,
    pub command: String,
    pub cwd: String,
    pub env: Vec<(String, String)>,
    pub ids: Option<(u32, u32)>,
    pub timeout_ms: u64,
    pub keep_stdin: bool,
    /// Its output also goes to the sandbox's log, a line an entry (a template's start command:
    /// stdout `info`, stderr `error`), as envd's `logOutput` does.
    pub log: bool,
}

impl Table {
    pub fn new() -> Self {
        Table {
            procs: Mutex::new(TableInner {
                by_id: HashMap::new(),
                order: vec![],
                finished: vec![],
            }),
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<Proc>> {
        self.procs.lock().unwrap().by_id.get(id).cloned()
    }

    pub fn list(&self) -> Vec<Arc<Proc>> {
        let t = self.procs.lock().unwrap();
        t.order
            .iter()
            .filter_map(|id| t.by_id.get(id).cloned())
            .collect()
    }

    /// Starts `spec` as `id`; the spawn's error when it cannot (the caller lets envd word it).
    /// `listed`: false for the warmup, which no listing shows.
    /// Returns the process and its `start` view, taken before it can have ended (as envd's is).
    pub fn start(
        self: &Arc<Self>,
        id: String,
        spec: Spec,
        listed: bool,
    ) -> io::Result<(Arc<Proc>, String)> {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .current_dir(&spec.cwd)
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = spec.ids {
            cmd.uid(uid).gid(gid);
        }
        // SAFETY: only setsid(2), async-signal-safe, runs between fork and exec.
        unsafe {
            cmd.pre_exec(sys::new_session);
        }
        let mut child = cmd.spawn()?;
        let pid = child.id() as i32;
        let mut stdin = child.stdin.take();
        if !spec.keep_stdin {
            stdin = None;
        }
        let proc = Arc::new(Proc {
            id: id.clone(),
            pid,
            command: spec.command,
            cwd: spec.cwd,
            started_at: sys::iso(sys::now_ms()),
            state: Mutex::new(State {
                output: OutLog::new(OUTPUT_LOG_BYTES),
                stdout: OutLog::new(STREAM_LOG_BYTES),
                stderr: OutLog::new(STREAM_LOG_BYTES),
                code: None,
                signal: None,
                timed_out: false,
            }),
            changed: Condvar::new(),
            stdin: Mutex::new(stdin),
        });
        let info = proc.info_json();
        let name = spec.program.rsplit('/').next().unwrap_or("").to_string();
        let fields = vec![
            ("pid".to_string(), pid.to_string()),
            ("cmd".to_string(), name.clone()),
        ];
        log().write("info", &format!("process {} started", name), fields.clone());
        if listed {
            let mut t = self.procs.lock().unwrap();
            t.by_id.insert(id.clone(), proc.clone());
            t.order.push(id);
        }
        let deadline =
            (spec.timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(spec.timeout_ms));
        let log_lines = spec.log.then(|| {
            let fields = vec![
                ("pid".to_string(), pid.to_string()),
                ("source".to_string(), "start".to_string()),
            ];
            log().write("info", "start command started", fields.clone());
            fields
        });
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        // One thread a process: it reads both pipes, keeps the deadline and reaps the process.
        let run = {
            let proc = proc.clone();
            let table = self.clone();
            move || {
                follow_pipes(&proc, stdout, stderr, deadline, log_lines);
                let status = wait_until(&proc, &mut child, deadline);
                table.settle(&proc, status, listed, &name, &fields);
            }
        };
        if let Err(run) = spawn(run) {
            // No thread to be had (the sandbox's process limit): the process cannot be followed.
            sys::kill_group(pid, 9);
            run();
        }
        Ok((proc, info))
    }

    /// The process ended and its pipes closed (Node's 'close'): its logs close, the log says
    /// how it ended, and old finished entries are let go.
    fn settle(
        &self,
        proc: &Arc<Proc>,
        (code, signal): (Option<i32>, Option<i32>),
        listed: bool,
        name: &str,
        fields: &[(String, String)],
    ) {
        // In envd's order ('close' listeners): the log's line, the table letting old entries go,
        // then the logs closed. A client that reads this one's `exit` and asks at once finds the
        // log and the table as they are after it.
        let mut fields = fields.to_vec();
        let how = match signal.and_then(sys::signal_name) {
            Some(sig) => {
                fields.push(("signal".into(), sig.into()));
                format!("killed by {}", sig)
            }
            None => {
                let c = code.map(|c| c.to_string()).unwrap_or_else(|| "null".into());
                fields.push(("exitCode".into(), c.clone()));
                format!("exited with code {}", c)
            }
        };
        log().write(
            if code == Some(0) { "info" } else { "warn" },
            &format!("process {} {}", name, how),
            fields,
        );
        if listed {
            self.retire(&proc.id);
        }
        *proc.stdin.lock().unwrap() = None;
        let mut s = proc.state.lock().unwrap();
        s.code = code;
        s.signal = signal;
        s.output.done = true;
        s.stdout.done = true;
        s.stderr.done = true;
        drop(s);
        proc.changed.notify_all();
    }

    fn retire(&self, id: &str) {
        let mut t = self.procs.lock().unwrap();
        t.finished.push(id.to_string());
        let mut i = 0;
        while t.finished.len() > FINISHED_KEPT && i < t.finished.len() {
            let old = t.finished[i].clone();
            // A group with members left (`cmd &`) stays, so a kill still reaches them.
            let alive = t
                .by_id
                .get(&old)
                .map(|p| sys::kill_group(p.pid, 0))
                .unwrap_or(false);
            if alive {
                i += 1;
                continue;
            }
            t.by_id.remove(&old);
            t.order.retain(|x| x != &old);
            t.finished.remove(i);
        }
    }

    pub fn kill_all(&self) {
        for p in self.procs.lock().unwrap().by_id.values() {
            sys::kill_group(p.pid, 9);
        }
    }
}

/// Runs `f` on a thread of its own; `f` back when no thread can be had (the sandbox's process
/// limit counts threads too), for the caller to do without.
pub fn spawn<F: FnOnce() + Send + 'static>(f: F) -> Result<(), F> {
    // The closure is kept aside until the thread is known to run.
    let slot = Arc::new(Mutex::new(Some(f)));
    let theirs = slot.clone();
    let started = thread::Builder::new().stack_size(STACK).spawn(move || {
        if let Some(f) = theirs.lock().unwrap().take() {
            f();
        }
    });
    match started {
        Ok(_) => Ok(()),
        Err(_) => Err(slot.lock().unwrap().take().expect("not run")),
    }
}

/// Reads a process's stdout and stderr into its logs until both close, killing its group once
/// `deadline` passes.
fn follow_pipes(
    proc: &Proc,
    stdout: ChildStdout,
    stderr: ChildStderr,
    deadline: Option<Instant>,
    log_lines: Option<Vec<(String, String)>>,
) {
    let mut pipes = [Some(stdout.into_raw_fd()), Some(stderr.into_raw_fd())];
    let mut buf = vec![0u8; 16 * 1024];
    // What each stream has written since its last newline, for the sandbox's log.
    let mut partial: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let level = |i: usize| if i == 0 { "info" } else { "error" };
    let to_log = |i: usize, line: &[u8], fields: &[(String, String)]| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        log().write(level(i), &String::from_utf8_lossy(line), fields.to_vec());
    };
    while pipes.iter().any(|p| p.is_some()) {
        let mut fds: Vec<sys::PollFd> = pipes
            .iter()
            .map(|p| sys::PollFd {
                fd: p.unwrap_or(-1),
                events: sys::POLLIN,
                revents: 0,
            })
            .collect();
        let wait = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    time_out(proc);
                    -1
                } else {
                    (d - now).as_millis().min(i32::MAX as u128) as i32 + 1
                }
            }
            None => -1,
        };
        let wait = if proc.state.lock().unwrap().timed_out {
            -1
        } else {
            wait
        };
        if sys::poll(&mut fds, wait) < 0 {
            continue;
        }
        for (i, fd) in fds.iter().enumerate() {
            if fd.revents == 0 || fd.fd < 0 {
                continue;
            }
            match sys::read(fd.fd, &mut buf) {
                n if n > 0 => {
                    let data = &buf[..n as usize];
                    let mut s = proc.state.lock().unwrap();
                    s.output.append(data);
                    if i == 0 {
                        s.stdout.append(data)
                    } else {
                        s.stderr.append(data)
                    }
                    drop(s);
                    proc.changed.notify_all();
                    if let Some(fields) = &log_lines {
                        partial[i].extend_from_slice(data);
                        while let Some(at) = partial[i].iter().position(|b| *b == b'\n') {
                            let line: Vec<u8> = partial[i].drain(..=at).collect();
                            to_log(i, &line[..line.len() - 1], fields);
                        }
                        // A program printing without newlines: cut, as envd cuts it.
                        if partial[i].len() > slog::LINE_MAX_BYTES {
                            let line = std::mem::take(&mut partial[i]);
                            to_log(i, &line, fields);
                        }
                    }
                }
                n if n < 0 && sys::interrupted() => {}
                _ => {
                    sys::close(fd.fd);
                    pipes[i] = None;
                    if let Some(fields) = &log_lines {
                        if !partial[i].is_empty() {
                            let line = std::mem::take(&mut partial[i]);
                            to_log(i, &line, fields);
                        }
                    }
                }
            }
        }
    }
}

fn time_out(proc: &Proc) {
    let mut s = proc.state.lock().unwrap();
    if !s.timed_out {
        s.timed_out = true;
        drop(s);
        sys::kill_group(proc.pid, 9);
    }
}

/// Reaps the process (its pipes are closed; it may still run), still keeping the deadline:
/// (exit code, signal).
fn wait_until(
    proc: &Proc,
    child: &mut Child,
    deadline: Option<Instant>,
) -> (Option<i32>, Option<i32>) {
    if let Some(d) = deadline {
        loop {
            match child.try_wait() {
                Ok(Some(st)) => return (st.code(), st.signal()),
                Ok(None) if Instant::now() >= d => {
                    time_out(proc);
                    break;
                }
                Ok(None) => thread::sleep(Duration::from_millis(20)),
                Err(_) => return (None, None),
            }
        }
    }
    match child.wait() {
        Ok(st) => (st.code(), st.signal()),
        Err(_) => (None, None),
    }
}

/// The length of `data` without a UTF-8 sequence cut short at its end (process-events.ts).
pub fn complete_utf8_len(data: &[u8]) -> usize {
    let n = data.len();
    let mut i = n;
    while i > 0 && i + 4 > n {
        i -= 1;
        let b = data[i];
        if b & 0xc0 == 0x80 {
            continue;
        }
        let size = if b >= 0xf8 {
            1
        } else if b >= 0xf0 {
            4
        } else if b >= 0xe0 {
            3
        } else if b >= 0xc0 {
            2
        } else {
            1
        };
        return if i + size > n { i } else { n };
    }
    n
}

/// The byte where the last whole UTF-8 character ends (groups/process.ts `utf8Boundary`).
pub fn utf8_boundary(data: &[u8]) -> usize {
    let n = data.len();
    for back in 1..=n.min(4) {
        let b = data[n - back];
        if b & 0xc0 == 0x80 {
            continue;
        }
        let size = if b >= 0xf0 {
            4
        } else if b >= 0xe0 {
            3
        } else if b >= 0xc0 {
            2
        } else {
            1
        };
        return if size > back { n - back } else { n };
    }
    n
}

fn event_line(stream: &str, data: &[u8], offset: u64, next: u64, base64: bool) -> String {
    let mut o = format!("{{\"stream\":\"{}\",\"data\":", stream);
    if base64 {
        o.push('"');
        o.push_str(&sys::base64(data));
        o.push_str("\",\"encoding\":\"base64\"");
    } else {
        quote(&mut o, &String::from_utf8_lossy(data));
    }
    o.push_str(&format!(",\"offset\":{},\"next\":{}}}\n", offset, next));
    o
}

/// A process's events from `from` (stdout, stderr offsets) as envd's `processEvents` writes them,
/// each line handed to `send`; stops at `exit`, when not following at the output there is, or
/// when `send` fails (the client went).
pub fn events(
    proc: &Proc,
    from: (u64, u64),
    follow: bool,
    base64: bool,
    send: &mut dyn FnMut(&str) -> io::Result<()>,
) -> io::Result<()> {
    let mut at = [from.0, from.1];
    let names = ["stdout", "stderr"];
    loop {
        let mut lines = Vec::new();
        let mut seen = [0u64; 2];
        let finished;
        {
            let s = proc.state.lock().unwrap();
            for (i, log) in [&s.stdout, &s.stderr].into_iter().enumerate() {
                if at[i] < log.start() {
                    lines.push(format!(
                        "{{\"stream\":\"{}\",\"dropped\":{},\"offset\":{}}}\n",
                        names[i],
                        log.start() - at[i],
                        log.start()
                    ));
                    at[i] = log.start();
                }
                loop {
                    let (data, offset) = log.read(at[i], EVENT_BYTES);
                    let last = log.done && offset + data.len() as u64 == log.end();
                    let size = if last || base64 {
                        data.len()
                    } else {
                        complete_utf8_len(&data)
                    };
                    if size == 0 {
                        break;
                    }
                    at[i] = offset + size as u64;
                    lines.push(event_line(names[i], &data[..size], offset, at[i], base64));
                }
                seen[i] = log.end();
            }
            finished = s.stdout.done
                && s.stderr.done
                && at[0] >= s.stdout.end()
                && at[1] >= s.stderr.end();
            if finished {
                lines.push(format!(
                    "{{\"exit\":{{\"code\":{},\"signal\":{},\"timed_out\":{}}}}}\n",
                    s.code
                        .map(|c| c.to_string())
                        .unwrap_or_else(|| "null".into()),
                    signal_json(s.signal),
                    s.timed_out
                ));
            }
        }
        for line in &lines {
            send(line)?;
        }
        if finished || !follow {
            return Ok(());
        }
        let deadline = Instant::now() + KEEPALIVE;
        let mut s = proc.state.lock().unwrap();
        loop {
            let moved = s.stdout.end() != seen[0]
                || s.stderr.end() != seen[1]
                || s.stdout.done
                || s.stderr.done;
            if moved {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                drop(s);
                send("{\"keepalive\":true}\n")?;
                break;
            }
            s = proc.changed.wait_timeout(s, deadline - now).unwrap().0;
        }
    }
}

/// `GET /process/{id}/output` without follow: `{ data, offset, next_offset, done }`.
pub fn output_json(proc: &Proc, offset: u64) -> String {
    let s = proc.state.lock().unwrap();
    let (data, from) = s.output.read(offset, usize::MAX);
    let next = from + data.len() as u64;
    let cut = if s.output.done {
        data.len()
    } else {
        utf8_boundary(&data)
    };
    let mut o = String::from("{\"data\":");
    quote(&mut o, &String::from_utf8_lossy(&data[..cut]));
    o.push_str(&format!(
        ",\"offset\":{},\"next_offset\":{},\"done\":{}}}",
        from,
        next - (data.len() - cut) as u64,
        s.output.done && cut == data.len()
    ));
    o
}

/// `GET /process/{id}/output?follow=true`: the interleaved output's bytes as they come.
pub fn follow_output(
    proc: &Proc,
    offset: u64,
    send: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut at = offset;
    loop {
        let (data, done, from) = {
            let mut s = proc.state.lock().unwrap();
            while s.output.end() <= at && !s.output.done {
                s = proc.changed.wait_timeout(s, KEEPALIVE).unwrap().0;
            }
            let (data, from) = s.output.read(at, EVENT_BYTES);
            (data, s.output.done, from)
        };
        if !data.is_empty() {
            send(&data)?;
            at = from + data.len() as u64;
            continue;
        }
        if done {
            return Ok(());
        }
    }
}

/// Writes to a process's stdin; `eof` closes it. Err(message) when it no longer takes input.
pub fn write_stdin(proc: &Proc, data: &[u8], eof: bool) -> Result<(), ()> {
    if proc.state.lock().unwrap().output.done {
        return Err(());
    }
    let mut stdin = proc.stdin.lock().unwrap();
    let Some(pipe) = stdin.as_mut() else {
        return Err(());
    };
    // A process that exited meanwhile: the write fails (EPIPE), as Node's would be ignored.
    let _ = pipe.write_all(data);
    if eof {
        *stdin = None;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn utf8_cuts() {
        assert_eq!(complete_utf8_len("aé".as_bytes()), 3);
        assert_eq!(complete_utf8_len(&"aé".as_bytes()[..2]), 1);
        assert_eq!(complete_utf8_len(&"a😀".as_bytes()[..3]), 1);
        assert_eq!(utf8_boundary(&"a😀".as_bytes()[..4]), 1);
        assert_eq!(utf8_boundary("a😀".as_bytes()), 5);
        let mut log = OutLog::new(10_000);
        log.append(&[b'a'; 9000]);
        log.append(b"bc");
        assert_eq!(log.start(), 0);
        log.append(&[b'd'; 9000]);
        assert_eq!(log.start(), 9000);
        assert_eq!(log.read(3, 2), (b"bc".to_vec(), 9000));
    }
}
