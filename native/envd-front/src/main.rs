//! envd's front: the resident part of a sandbox's envd (issue 50, docs/providers.md "envd's
//! front"). It holds envd's socket for the sandbox's whole life and runs the sandbox's commands
//! itself (`POST /exec` and the routes of the processes it started) while Node's envd sleeps;
//! everything else it hands to Node's envd, started on demand on a socket of its own, one request
//! at a time. Node's envd stays the one full implementation: any request the front does not
//! understand exactly (a malformed body, an option it lacks, an error to word) goes there.
//!
//! usage: envd-front --socket PATH --token-file FILE [--capabilities LIST] [--template NAME]
//!                   [--runtime-shell PATH] -- NODE ENVD-ARGS...
//! ENVD-ARGS must hold `--socket NODE_SOCKET` and `--token-file -` (the tokens come on its stdin).

mod http;
mod json;
mod procs;
mod slog;
mod sys;

use http::{Conn, Framing, Head};
use json::{quote, Value};
use procs::{Proc, Spec, Table};
use slog::log;
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a request waits for Node's envd to start (or to finish going to sleep and start
/// again) before it is answered 503: the daemon's wake timeout (ENVD_WAKE_TIMEOUT_MS).
const NODE_START_TIMEOUT: Duration = Duration::from_secs(10);
/// envd's exit code when it went to sleep (runtime/envd/idle.ts ASLEEP_EXIT_CODE).
const ASLEEP: i32 = 75;
/// A request body the front reads whole to decide on (a command's JSON); a larger one goes to
/// Node as it comes.
const BODY_LIMIT: usize = 1024 * 1024;
/// The arguments `POST /exec` takes (runtime/envd/exec.ts): any other is Node's to judge.
const EXEC_ARGS: &[&str] = &[
    "cmd", "argv", "cwd", "env", "timeout", "stdin", "user", "output", "log",
];

struct Config {
    socket: String,
    node_socket: String,
    node: Vec<String>,
    client: Vec<u8>,
    control: Vec<u8>,
    capabilities: Vec<String>,
    runtime_shell: String,
    run_dir: PathBuf,
}

/// Node's envd: whether it runs, and what the front keeps for its next start.
struct NodeState {
    awake: bool,
    starting: bool,
    /// The environment later processes get (Node's, as it saved it going to sleep).
    env: BTreeMap<String, String>,
    next_process: u64,
    next_terminal: u64,
}

struct Front {
    cfg: Config,
    /// (client, control): the token file's, or what a `PUT /tokens` envd took replaced them with.
    tokens: Mutex<(Vec<u8>, Vec<u8>)>,
    node: Mutex<NodeState>,
    node_changed: Condvar,
    table: Arc<Table>,
    next_warmup: Mutex<u64>,
}

#[derive(PartialEq, Clone, Copy)]
enum Access {
    Control,
    Client,
}

fn main() {
    sys::one_arena();
    let cfg = match config() {
        Ok(cfg) => cfg,
        Err(message) => {
            eprintln!("envd-front: {}", message);
            std::process::exit(2);
        }
    };
    let mut env: BTreeMap<String, String> = std::env::vars().collect();
    let (next_process, next_terminal) = load_saved(&cfg.run_dir, &mut env);
    let front = Arc::new(Front {
        tokens: Mutex::new((cfg.client.clone(), cfg.control.clone())),
        node: Mutex::new(NodeState {
            awake: false,
            starting: false,
            env,
            next_process,
            next_terminal,
        }),
        node_changed: Condvar::new(),
        table: Arc::new(Table::new()),
        next_warmup: Mutex::new(1),
        cfg,
    });
    // A home (or /tmp) filled from a template (rootless sandboxes) is filled before anything is
    // answered: by Node's envd itself, once, as at its first start.
    if front
        .cfg
        .node
        .iter()
        .any(|a| a == "--home-template" || a == "--tmp-template")
    {
        if let Err(message) = front.seed() {
            eprintln!("envd-front: {}", message);
            std::process::exit(1);
        }
    }
    let _ = fs::remove_file(&front.cfg.socket);
    let listener = match UnixListener::bind(&front.cfg.socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("envd-front: cannot listen on {}: {}", front.cfg.socket, e);
            std::process::exit(1);
        }
    };
    let _ = fs::set_permissions(&front.cfg.socket, fs::Permissions::from_mode(0o600));
    log().write(
        "info",
        "envd started",
        vec![("pid".into(), std::process::id().to_string())],
    );
    println!(
        "{{\"event\":\"listening\",\"socket\":{},\"pid\":{},\"front\":true}}",
        json::quoted(&front.cfg.socket),
        std::process::id()
    );
    let _ = io::stdout().flush();
    // One thread kept in reserve, started now: when the sandbox's process limit leaves no thread
    // for a new connection (a fork bomb holds every pid), the reserve serves it, one at a time,
    // so the daemon can still reach envd (and kill the bomb) as it could reach Node's envd.
    let (reserve, jobs) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
    if procs::spawn(move || {
        for job in jobs {
            job();
        }
    })
    .is_err()
    {
        eprintln!("envd-front: cannot start its reserve thread");
    }
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let front = front.clone();
        let job = move || {
            let _ = serve(&front, Conn::new(stream));
        };
        if let Err(job) = procs::spawn(job) {
            // Dropped only if the reserve is gone too.
            let _ = reserve.send(Box::new(job));
        }
    }
}

fn config() -> Result<Config, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let split = args
        .iter()
        .position(|a| a == "--")
        .ok_or("no -- before envd's command line")?;
    let (own, node) = (&args[..split], args[split + 1..].to_vec());
    let mut opts: BTreeMap<&str, &str> = BTreeMap::new();
    let mut i = 0;
    while i < own.len() {
        let name = own[i]
            .strip_prefix("--")
            .ok_or_else(|| format!("unexpected {}", own[i]))?;
        let value = own
            .get(i + 1)
            .ok_or_else(|| format!("--{} needs a value", name))?;
        if ![
            "socket",
            "token-file",
            "capabilities",
            "template",
            "runtime-shell",
        ]
        .contains(&name)
        {
            return Err(format!("unknown option --{}", name));
        }
        opts.insert(name, value);
        i += 2;
    }
    let socket = opts
        .get("socket")
        .ok_or("--socket is required")?
        .to_string();
    let node_socket = node
        .iter()
        .position(|a| a == "--socket")
        .and_then(|at| node.get(at + 1))
        .ok_or("envd's command line has no --socket")?
        .clone();
    if node_socket == socket {
        return Err("envd's --socket must differ from the front's".into());
    }
    if node.is_empty() {
        return Err("no envd command line".into());
    }
    let token_file = opts.get("token-file").ok_or("--token-file is required")?;
    let text =
        fs::read_to_string(token_file).map_err(|e| format!("cannot read {}: {}", token_file, e))?;
    // Emptied at once, as the shell loop did: no later process of the sandbox reads it.
    let _ = fs::write(token_file, "");
    let mut lines = text.split('\n').map(|l| l.trim());
    let client = lines.next().unwrap_or("").as_bytes().to_vec();
    let mut control = lines.next().unwrap_or("").as_bytes().to_vec();
    if client.is_empty() {
        return Err("the token file is empty; refusing to serve without a token".into());
    }
    if control.is_empty() {
        // No control token: one nobody knows, so the client token stays limited (as envd does).
        control = sys::uuid().into_bytes();
        control.extend_from_slice(sys::uuid().as_bytes());
    }
    let capabilities = opts
        .get("capabilities")
        .map(|c| {
            c.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_else(|| {
            vec![
                "shell".into(),
                "files".into(),
                "code".into(),
                "ports".into(),
            ]
        });
    let run_dir = Path::new(&socket)
        .parent()
        .unwrap_or(Path::new("/"))
        .to_path_buf();
    Ok(Config {
        runtime_shell: opts
            .get("runtime-shell")
            .unwrap_or(&"/opt/abx/bin/sh")
            .to_string(),
        socket,
        node_socket,
        node,
        client,
        control,
        capabilities,
        run_dir,
    })
}

/// What Node's envd left in the run folder when it went to sleep: its environment (env.json) and
/// its next ids (ids.json). The ids default to 1.
fn load_saved(run_dir: &Path, env: &mut BTreeMap<String, String>) -> (u64, u64) {
    if let Some(Value::Obj(fields)) = fs::read(run_dir.join("env.json"))
        .ok()
        .and_then(|t| json::parse(&t))
    {
        for (name, value) in fields {
            if let Value::Str(value) = value {
                if env_name_ok(&name) {
                    env.insert(name, value);
                }
            }
        }
    }
    let ids = fs::read(run_dir.join("ids.json"))
        .ok()
        .and_then(|t| json::parse(&t));
    let id = |key: &str| match ids.as_ref().and_then(|v| v.get(key)) {
        Some(Value::Num(n)) if *n >= 1.0 && n.fract() == 0.0 => *n as u64,
        _ => 1,
    };
    (id("process"), id("terminal"))
}

fn env_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && !b[0].is_ascii_digit()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

fn write_private(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    let ok = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if ok.is_ok() {
        let _ = fs::rename(&tmp, path);
    }
}

impl Front {
    /// Starts Node's envd unless it runs, and waits until it listens.
    fn wake_node(self: &Arc<Self>) -> Result<(), String> {
        let deadline = Instant::now() + NODE_START_TIMEOUT;
        let mut st = self.node.lock().unwrap();
        if !st.awake && !st.starting {
            st.starting = true;
            if let Err(e) = self.start_node() {
                st.starting = false;
                return Err(format!("cannot start envd: {}", e));
            }
        }
        while !st.awake {
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "envd did not start within {} s",
                    NODE_START_TIMEOUT.as_secs()
                ));
            }
            st = self
                .node_changed
                .wait_timeout(st, deadline - now)
                .unwrap()
                .0;
            if !st.awake && !st.starting {
                return Err("envd exited as it started".into());
            }
        }
        Ok(())
    }

    /// Node's envd with `extra` arguments, its tokens on its stdin (`--token-file -`), never an
    /// argument or the environment.
    fn spawn_node(&self, extra: &[&str], stdout: Stdio) -> io::Result<std::process::Child> {
        let cfg = &self.cfg;
        let mut child = Command::new(&cfg.node[0])
            .args(&cfg.node[1..])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(stdout)
            .stderr(Stdio::inherit())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            let (client, control) = self.tokens.lock().unwrap().clone();
            let mut tokens = client;
            tokens.push(b'\n');
            tokens.extend_from_slice(&control);
            tokens.push(b'\n');
            let _ = stdin.write_all(&tokens);
        }
        Ok(child)
    }

    fn seed(&self) -> Result<(), String> {
        let status = self
            .spawn_node(&["--seed-only"], Stdio::null())
            .and_then(|mut child| child.wait())
            .map_err(|e| format!("cannot start envd to fill the home: {}", e))?;
        if !status.success() {
            return Err(format!("envd could not fill the home ({})", status));
        }
        Ok(())
    }

    fn start_node(self: &Arc<Self>) -> io::Result<()> {
        let mut child = self.spawn_node(&[], Stdio::piped())?;
        let pid = child.id() as i32;
        let stdout = child.stdout.take().expect("piped");
        let front = self.clone();
        let follow = move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                front.node_line(&line);
            }
            let code = child.wait().ok().and_then(|s| s.code()).unwrap_or(1);
            let mut st = front.node.lock().unwrap();
            st.awake = false;
            st.starting = false;
            if code != ASLEEP {
                log().write(
                    "error",
                    &format!("envd exited with code {}; the sandbox ends", code),
                    vec![],
                );
                front.table.kill_all();
                std::process::exit(code);
            }
            let mut env: BTreeMap<String, String> = std::env::vars().collect();
            let (p, t) = load_saved(&front.cfg.run_dir, &mut env);
            st.env = env;
            st.next_process = st.next_process.max(p);
            st.next_terminal = st.next_terminal.max(t);
            front.node_changed.notify_all();
        };
        if procs::spawn(follow).is_err() {
            // Nothing would read its stdout or see it exit: it is stopped.
            sys::kill_one(pid, 9);
            return Err(io::Error::other(
                "no thread to follow envd (the sandbox's process limit)",
            ));
        }
        Ok(())
    }

    /// A line Node's envd wrote on its stdout: that it listens, or a line of the sandbox's log.
    fn node_line(&self, line: &str) {
        if line.starts_with("{\"event\":\"listening\"") {
            let mut st = self.node.lock().unwrap();
            st.awake = true;
            st.starting = false;
            self.node_changed.notify_all();
            return;
        }
        let Some(entry) = json::parse(line.as_bytes()) else {
            return;
        };
        let Some(entry) = entry.get("log") else {
            return;
        };
        let text = |k: &str| match entry.get(k) {
            Some(Value::Str(s)) => s.clone(),
            _ => String::new(),
        };
        let fields = match entry.get("fields") {
            Some(Value::Obj(f)) => f
                .iter()
                .filter_map(|(k, v)| match v {
                    Value::Str(s) => Some((k.clone(), s.clone())),
                    _ => None,
                })
                .collect(),
            _ => vec![],
        };
        let at = match entry.get("at") {
            Some(Value::Num(n)) => *n as u64,
            _ => sys::now_ms(),
        };
        let level = match text("level").as_str() {
            l @ ("debug" | "info" | "warn" | "error") => l.to_string(),
            _ => "info".into(),
        };
        log().write_at(at, &level, &text("message"), fields);
    }

    fn node_awake(&self) -> bool {
        let st = self.node.lock().unwrap();
        st.awake || st.starting
    }

    fn own(&self, id: &str) -> Option<Arc<Proc>> {
        self.table.get(id)
    }
}

/// Who presents what: the control token, the client token (limited to the template's
/// capabilities), or neither.
fn access(front: &Front, head: &Head) -> Option<Access> {
    let given = head
        .field("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let (client, control) = front.tokens.lock().unwrap().clone();
    if sys::same_secret(given.as_bytes(), &control) {
        Some(Access::Control)
    } else if sys::same_secret(given.as_bytes(), &client) {
        Some(Access::Client)
    } else {
        None
    }
}

/// The capability a route needs, by its first segment (runtime/protocol/capabilities.ts).
fn capability(first: &str) -> Option<&'static str> {
    match first {
        "execute" | "contexts" => Some("code"),
        "exec" | "process" | "terminal" | "dev-tools" => Some("shell"),
        "files" => Some("files"),
        "ports" => Some("ports"),
        _ => None,
    }
}

/// Serves one connection: request after request, each answered here or by Node's envd.
fn serve(front: &Arc<Front>, mut conn: Conn) -> io::Result<()> {
    loop {
        let raw = match conn.head() {
            Ok(Some(raw)) => raw,
            Ok(None) => return Ok(()),
            // A head past the front's limit: envd's parser words the refusal (431).
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                let bytes = std::mem::take(&mut conn.buf);
                return forward_raw(front, &mut conn, &bytes);
            }
            Err(e) => return Err(e),
        };
        let Some(head) = Head::parse(raw.clone()).filter(Head::valid_request) else {
            return forward_raw(front, &mut conn, &raw);
        };
        let keep = head.keep_alive();
        http::set_browser(head.field("origin").is_some());
        let go_on = match handle(front, &mut conn, &head, keep)? {
            Handled::Answered => keep,
            Handled::Forward(body) => forward(front, &mut conn, &head, body)?,
        };
        if !go_on {
            return Ok(());
        }
    }
}

enum Handled {
    Answered,
    /// For Node's envd, with the body read so far as it came (None: not read yet).
    Forward(Option<Vec<u8>>),
}

fn handle(front: &Arc<Front>, conn: &mut Conn, head: &Head, keep: bool) -> io::Result<Handled> {
    let method = head.first[0].as_str();
    let Some((path, query)) = http::segments(&head.first[1]) else {
        return Ok(Handled::Forward(None));
    };
    let p: Vec<&str> = path.iter().map(|s| s.as_str()).collect();
    let Some(framing) = head.request_framing() else {
        return Ok(Handled::Forward(None));
    };
    let bodiless = framing == Framing::None || framing == Framing::Length(0);
    if method == "GET" && p == ["health"] && bodiless {
        http::json(&mut conn.stream, 200, "{\"status\":\"ok\"}", keep)?;
        return Ok(Handled::Answered);
    }
    let Some(who) = access(front, head) else {
        if !bodiless {
            return Ok(Handled::Forward(None));
        }
        http::error(
            &mut conn.stream,
            401,
            "AuthenticationError",
            "missing or wrong token: send the header \"Authorization: Bearer <token>\"",
            keep,
        )?;
        return Ok(Handled::Answered);
    };
    if who == Access::Client {
        if let Some(needed) = p.first().and_then(|f| capability(f)) {
            if !front.cfg.capabilities.iter().any(|c| c == needed) {
                return Ok(Handled::Forward(None));
            }
        }
    }
    // Every other route streams to Node's envd as it comes (an upload is never held here), and
    // so does a client that waits for `100 Continue` (envd sends it).
    if !answer_here(front, method, &p) || head.field("expect").is_some() {
        return Ok(Handled::Forward(None));
    }
    // The body, whole, for a route answered here.
    let (body, raw) = match framing {
        Framing::None => (Vec::new(), Vec::new()),
        Framing::Length(n) if n as usize <= BODY_LIMIT => {
            let body = conn.take(n as usize)?;
            (body.clone(), body)
        }
        Framing::Chunked => match conn.chunked(BODY_LIMIT)? {
            Some(both) => both,
            None => return Ok(Handled::Forward(None)),
        },
        _ => return Ok(Handled::Forward(None)),
    };
    let done = route(front, conn, head, method, &p, &query, &body, keep)?;
    Ok(if done {
        Handled::Answered
    } else {
        Handled::Forward(Some(raw))
    })
}

/// Whether a route may be answered here (before its body is judged).
fn answer_here(front: &Front, method: &str, p: &[&str]) -> bool {
    match (method, p) {
        ("GET", ["logs"]) | ("GET", ["process"]) | ("PUT", ["tokens"]) => true,
        ("POST", ["exec"]) | ("POST", ["exec", "warmup"]) | ("PUT", ["env"]) => !front.node_awake(),
        ("GET", ["exec", id, "events"])
        | ("GET", ["process", id])
        | ("POST", ["process", id, "stdin"])
        | ("POST", ["process", id, "kill"])
        | ("GET", ["process", id, "output"]) => front.own(id).is_some(),
        _ => false,
    }
}

/// Answers a request here; false when it is Node's after all (its body is not one the front
/// takes exactly, or it must be worded by envd).
#[allow(clippy::too_many_arguments)]
fn route(
    front: &Arc<Front>,
    conn: &mut Conn,
    head: &Head,
    method: &str,
    p: &[&str],
    query: &str,
    body: &[u8],
    keep: bool,
) -> io::Result<bool> {
    let out = &mut conn.stream;
    match (method, p) {
        ("GET", ["logs"]) => {
            let number = |name: &str, max: u64| -> Result<u64, String> {
                let raw = http::query_param(query, name)
                    .flatten()
                    .unwrap_or_else(|| "0".into());
                match raw.parse::<u64>() {
                    Ok(v) if raw.bytes().all(|b| b.is_ascii_digit()) && v <= max => Ok(v),
                    _ => Err(format!(
                        "{} must be a whole number from 0 to {}, not {}",
                        name, max, raw
                    )),
                }
            };
            match number("after", 9_007_199_254_740_991)
                .and_then(|a| Ok((a, number("wait", slog::MAX_WAIT_MS)?)))
            {
                Ok((after, wait)) => http::json(out, 200, &log().since_json(after, wait), keep)?,
                Err(message) => http::error(out, 400, "BadRequestError", &message, keep)?,
            }
            Ok(true)
        }
        ("GET", ["process"]) => {
            let own: Vec<String> = front.table.list().iter().map(|p| p.info_json()).collect();
            if !front.node_awake() {
                http::json(
                    out,
                    200,
                    &format!("{{\"processes\":[{}]}}", own.join(",")),
                    keep,
                )?;
                return Ok(true);
            }
            // Node's envd runs: its list, and the front's processes with it.
            match forward_whole(front, head, body) {
                Ok((status, text))
                    if status == 200
                        && text.starts_with("{\"processes\":[")
                        && text.ends_with("]}") =>
                {
                    let node = &text["{\"processes\":[".len()..text.len() - 2];
                    let all: Vec<&str> = own
                        .iter()
                        .map(|s| s.as_str())
                        .chain(if node.is_empty() { None } else { Some(node) })
                        .collect();
                    http::json(
                        out,
                        200,
                        &format!("{{\"processes\":[{}]}}", all.join(",")),
                        keep,
                    )?;
                }
                Ok((status, text)) => http::json(out, status, &text, keep)?,
                Err(message) => unavailable(out, &message, keep)?,
            }
            Ok(true)
        }
        ("PUT", ["tokens"]) => {
            // envd judges the replacement (once, the control token, well-formed tokens); once it
            // took it, the front takes the same, and the old tokens are refused here too.
            match forward_whole(front, head, body) {
                Ok((status, text)) => {
                    if status == 200 {
                        let given = object(body);
                        let token = |k: &str| match given.as_ref().and_then(|v| v.get(k)) {
                            Some(Value::Str(t)) => Some(t.as_bytes().to_vec()),
                            _ => None,
                        };
                        if let (Some(client), Some(control)) = (token("client"), token("control")) {
                            *front.tokens.lock().unwrap() = (client, control);
                        }
                    }
                    http::json(out, status, &text, keep)?;
                }
                Err(message) => unavailable(out, &message, keep)?,
            }
            Ok(true)
        }
        ("GET", ["process", id]) => {
            let proc = front.own(id).expect("checked");
            http::json(out, 200, &proc.info_json(), keep)?;
            Ok(true)
        }
        ("GET", ["process", id, "output"]) => {
            let proc = front.own(id).expect("checked");
            let offset = http::query_param(query, "offset").flatten();
            let follow = http::query_param(query, "follow").flatten();
            let Some(offset) = offset.map(|o| o.parse::<u64>().ok()).unwrap_or(Some(0)) else {
                return Ok(false);
            };
            match follow.as_deref() {
                None | Some("false") => {
                    http::json(out, 200, &procs::output_json(&proc, offset), keep)?
                }
                Some("true") => {
                    let mut chunked =
                        http::Chunked::start(out, "application/octet-stream", "", keep)?;
                    procs::follow_output(&proc, offset, &mut |data| chunked.send(data))?;
                    chunked.end()?;
                }
                _ => return Ok(false),
            }
            Ok(true)
        }
        ("POST", ["process", id, "kill"]) => {
            let proc = front.own(id).expect("checked");
            let args = match object(body) {
                Some(a) => a,
                None => return Ok(false),
            };
            let sig = match args.get("signal") {
                None => 9,
                Some(Value::Str(name)) => match sys::signal_number(name) {
                    Some(n) => n,
                    None => return Ok(false),
                },
                _ => return Ok(false),
            };
            if !only(&args, &["signal"]) {
                return Ok(false);
            }
            sys::kill_group(proc.pid, sig);
            http::json(out, 200, &proc.info_json(), keep)?;
            Ok(true)
        }
        ("POST", ["process", id, "stdin"]) => {
            let proc = front.own(id).expect("checked");
            let Some(args) = object(body) else {
                return Ok(false);
            };
            let Some(Value::Str(data)) = args.get("data") else {
                return Ok(false);
            };
            let eof = match args.get("eof") {
                None => false,
                Some(Value::Bool(b)) => *b,
                _ => return Ok(false),
            };
            let bytes = match args.get("encoding") {
                None => data.as_bytes().to_vec(),
                Some(Value::Str(e)) if e == "text" => data.as_bytes().to_vec(),
                Some(Value::Str(e)) if e == "base64" => match sys::unbase64(data) {
                    Some(b) => b,
                    None => return Ok(false),
                },
                _ => return Ok(false),
            };
            if !only(&args, &["data", "eof", "encoding"]) {
                return Ok(false);
            }
            match procs::write_stdin(&proc, &bytes, eof) {
                Ok(()) => http::json(out, 200, &format!("{{\"written\":{}}}", bytes.len()), keep)?,
                Err(()) => http::error(
                    out,
                    400,
                    "BadRequestError",
                    &format!(
                        "process {} no longer takes input (it exited or its input was closed)",
                        id
                    ),
                    keep,
                )?,
            }
            Ok(true)
        }
        ("GET", ["exec", id, "events"]) => {
            let proc = front.own(id).expect("checked");
            let num = |name: &str| -> Option<u64> {
                match http::query_param(query, name)? {
                    None => Some(0),
                    Some(v) => v.parse::<u64>().ok(),
                }
            };
            let (Some(so), Some(se)) = (num("stdout_offset"), num("stderr_offset")) else {
                return Ok(false);
            };
            let follow = match http::query_param(query, "follow").flatten().as_deref() {
                None | Some("true") => true,
                Some("false") => false,
                _ => return Ok(false),
            };
            let base64 = match http::query_param(query, "output").flatten().as_deref() {
                None | Some("text") => false,
                Some("base64") => true,
                _ => return Ok(false),
            };
            stream_events(out, &proc, (so, se), follow, base64, None, keep)?;
            Ok(true)
        }
        ("POST", ["exec", "warmup"]) => {
            let spec = Spec {
                program: posix_shell(front),
                args: vec!["-c".into(), "true".into()],
                command: "true".into(),
                cwd: resolve("."),
                env: front.node.lock().unwrap().env.clone().into_iter().collect(),
                ids: None,
                timeout_ms: 10_000,
                keep_stdin: false,
                log: false,
            };
            let id = {
                let mut n = front.next_warmup.lock().unwrap();
                *n += 1;
                format!("w{}", *n - 1)
            };
            let Ok((proc, info)) = front.table.start(id, spec, false) else {
                return Ok(false);
            };
            stream_events(out, &proc, (0, 0), true, false, Some(info), keep)?;
            Ok(true)
        }
        ("POST", ["exec"]) => {
            let Some(args) = object(body) else {
                return Ok(false);
            };
            let Some((proc, info)) = start_exec(front, &args) else {
                return Ok(false);
            };
            let base64 = matches!(args.get("output"), Some(Value::Str(o)) if o == "base64");
            stream_events(out, &proc, (0, 0), true, base64, Some(info), keep)?;
            Ok(true)
        }
        ("PUT", ["env"]) => {
            let Some(args) = object(body) else {
                return Ok(false);
            };
            let Some(Value::Obj(vars)) = args.get("env") else {
                return Ok(false);
            };
            if !vars
                .iter()
                .all(|(k, v)| env_name_ok(k) && matches!(v, Value::Str(s) if !s.contains('\0')))
            {
                return Ok(false);
            }
            let mut st = front.node.lock().unwrap();
            if st.awake || st.starting {
                return Ok(false);
            }
            let mut names = Vec::new();
            for (k, v) in vars {
                if let Value::Str(v) = v {
                    st.env.insert(k.clone(), v.clone());
                    names.push(json::quoted(k));
                }
            }
            // Node's envd reads it when it next starts, as after its own sleep.
            let mut text = String::from("{");
            for (i, (k, v)) in st.env.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                quote(&mut text, k);
                text.push(':');
                quote(&mut text, v);
            }
            text.push('}');
            write_private(&front.cfg.run_dir.join("env.json"), &text);
            drop(st);
            http::json(
                out,
                200,
                &format!("{{\"set\":[{}]}}", names.join(",")),
                keep,
            )?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

fn object(body: &[u8]) -> Option<Value> {
    let text = if body.iter().all(|b| b.is_ascii_whitespace()) {
        &b"{}"[..]
    } else {
        body
    };
    match json::parse(text)? {
        v @ Value::Obj(_) => Some(v),
        _ => None,
    }
}

fn only(args: &Value, known: &[&str]) -> bool {
    match args {
        Value::Obj(fields) => fields.iter().all(|(k, _)| known.contains(&k.as_str())),
        _ => false,
    }
}

fn unavailable(out: &mut dyn Write, message: &str, keep: bool) -> io::Result<()> {
    http::error(out, 503, "EnvdUnavailableError", message, keep)
}

fn posix_shell(front: &Front) -> String {
    if Path::new("/bin/sh").exists() || !Path::new(&front.cfg.runtime_shell).exists() {
        "/bin/sh".into()
    } else {
        front.cfg.runtime_shell.clone()
    }
}

/// `path.resolve(p)`: absolute, `.` and `..` worked out, from the working directory.
fn resolve(p: &str) -> String {
    let base = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let joined = base.join(p);
    let mut parts: Vec<String> = Vec::new();
    for c in joined.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    format!("/{}", parts.join("/"))
}

fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// Who `user` is in /etc/passwd: (uid, gid, home).
fn passwd(user: &str) -> Option<(u32, u32, String)> {
    let text = fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 4 && f[0] == user {
            Some((
                f[2].parse().ok()?,
                f[3].parse().ok()?,
                f.get(5)
                    .filter(|h| !h.is_empty())
                    .unwrap_or(&"/")
                    .to_string(),
            ))
        } else {
            None
        }
    })
}

/// Starts `POST /exec`'s process as envd would, or None when envd should take the request: an
/// argument the front does not take exactly, a user it would refuse, a start that fails (envd
/// words those errors), or Node's envd woke meanwhile.
fn start_exec(front: &Arc<Front>, args: &Value) -> Option<(Arc<Proc>, String)> {
    if !only(args, EXEC_ARGS) {
        return None;
    }
    let text = |k: &str| -> Option<Option<String>> {
        match args.get(k) {
            None => Some(None),
            Some(Value::Str(s)) if !s.contains('\0') => Some(Some(s.clone())),
            _ => None,
        }
    };
    let (program, words, command) = match (args.get("cmd"), args.get("argv")) {
        (Some(Value::Str(cmd)), None) if !cmd.contains('\0') => (
            posix_shell(front),
            vec!["-c".to_string(), cmd.clone()],
            cmd.clone(),
        ),
        (None, Some(Value::Arr(items))) if !items.is_empty() => {
            let mut words = Vec::new();
            for item in items {
                match item {
                    Value::Str(s) if !s.contains('\0') => words.push(s.clone()),
                    _ => return None,
                }
            }
            if words[0].is_empty() {
                return None;
            }
            let line = format!(
                "exec {}",
                words
                    .iter()
                    .map(|w| shell_quote(w))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            (words[0].clone(), words[1..].to_vec(), line)
        }
        _ => return None,
    };
    let cwd = text("cwd")?.unwrap_or_else(|| ".".into());
    if cwd.is_empty() {
        return None;
    }
    let timeout = match args.get("timeout") {
        None => 0.0,
        Some(Value::Num(n)) if *n >= 0.0 => *n,
        _ => return None,
    };
    let keep_stdin = match args.get("stdin") {
        None => true,
        Some(Value::Bool(b)) => *b,
        _ => return None,
    };
    match args.get("output") {
        None => {}
        Some(Value::Str(o)) if o == "text" || o == "base64" => {}
        _ => return None,
    }
    let logged = match args.get("log") {
        None => false,
        Some(Value::Bool(b)) => *b,
        _ => return None,
    };
    let mut extra: Vec<(String, String)> = Vec::new();
    match args.get("env") {
        None => {}
        Some(Value::Obj(vars)) => {
            for (k, v) in vars {
                match v {
                    Value::Str(s) if env_name_ok(k) && !s.contains('\0') => {
                        extra.push((k.clone(), s.clone()))
                    }
                    _ => return None,
                }
            }
        }
        Some(Value::Str(lines)) => {
            for line in lines.split('\n').filter(|l| !l.trim().is_empty()) {
                let eq = line.find('=').filter(|&at| at > 0)?;
                let (k, v) = (&line[..eq], &line[eq + 1..]);
                if !env_name_ok(k) || v.contains('\0') {
                    return None;
                }
                extra.push((k.to_string(), v.to_string()));
            }
        }
        _ => return None,
    }
    let mut ids = None;
    let mut as_user: Vec<(String, String)> = Vec::new();
    if let Some(user) = text("user")? {
        let (uid, gid, home) = passwd(&user)?;
        if uid != sys::uid() {
            if sys::uid() != 0 {
                return None;
            }
            ids = Some((uid, gid));
            as_user = vec![
                ("HOME".into(), home),
                ("USER".into(), user.clone()),
                ("LOGNAME".into(), user),
            ];
        }
    }
    let mut st = front.node.lock().unwrap();
    if st.awake || st.starting {
        return None;
    }
    let mut env = st.env.clone();
    env.extend(as_user);
    env.extend(extra);
    let number = st.next_process;
    let spec = Spec {
        program,
        args: words,
        command,
        cwd: resolve(&cwd),
        env: env.into_iter().collect(),
        ids,
        timeout_ms: (timeout * 1000.0).round() as u64,
        keep_stdin,
        log: logged,
    };
    let started = front.table.start(format!("p{}", number), spec, true).ok()?;
    st.next_process = number + 1;
    write_private(
        &front.cfg.run_dir.join("ids.json"),
        &format!(
            "{{\"process\":{},\"terminal\":{}}}",
            st.next_process, st.next_terminal
        ),
    );
    Some(started)
}

fn stream_events(
    out: &mut UnixStream,
    proc: &Proc,
    from: (u64, u64),
    follow: bool,
    base64: bool,
    first: Option<String>,
    keep: bool,
) -> io::Result<()> {
    let mut chunked = http::Chunked::start(
        out,
        "application/x-ndjson; charset=utf-8",
        "cache-control: no-store\r\n",
        keep,
    )?;
    if let Some(info) = first {
        chunked.send(format!("{{\"start\":{}}}\n", info).as_bytes())?;
    }
    procs::events(proc, from, follow, base64, &mut |line| {
        chunked.send(line.as_bytes())
    })?;
    chunked.end()
}

/// Connects to Node's envd, starting it (again) as needed: a connect that finds no socket
/// meets an envd that is on its way to sleep, and is tried again once it has gone.
fn connect_node(front: &Arc<Front>) -> Result<UnixStream, String> {
    let deadline = Instant::now() + NODE_START_TIMEOUT;
    loop {
        front.wake_node()?;
        match UnixStream::connect(&front.cfg.node_socket) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("cannot reach envd: {}", e))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// What a request's body is written to: Node's envd, until it stops taking it (it answered early
/// and closed); the rest is read from the client and dropped, so the client gets to the answer.
struct NodeSink<'a> {
    node: &'a mut UnixStream,
    failed: bool,
}

impl Write for NodeSink<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if !self.failed && self.node.write_all(data).is_err() {
            self.failed = true;
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Hands one request to Node's envd and its answer back; whether the client's connection goes on.
/// A client that goes away (mid-body, or while envd works on the answer) closes the connection
/// to envd, which sees it go as it would have directly (a cut upload, an interrupted cell).
fn forward(
    front: &Arc<Front>,
    conn: &mut Conn,
    head: &Head,
    body: Option<Vec<u8>>,
) -> io::Result<bool> {
    let keep = head.keep_alive();
    let mut node = match connect_node(front) {
        Ok(s) => s,
        Err(message) => {
            // The body, unread, would be taken for the next request: the connection ends.
            unavailable(&mut conn.stream, &message, false)?;
            return Ok(false);
        }
    };
    let framing = head.request_framing();
    let _ = node.write_all(&head.raw);
    // The body goes to envd on a thread of its own while its answer is read here: envd may answer
    // before the body is whole (a declared length over its limit: 413; `Expect: 100-continue`).
    let mut body_conn = Conn {
        stream: conn.stream.try_clone()?,
        buf: std::mem::take(&mut conn.buf),
        watch: None,
    };
    let mut to_node = node.try_clone()?;
    let send_body = move || {
        let mut sink = NodeSink {
            node: &mut to_node,
            failed: false,
        };
        let sent = match (&body, framing) {
            (Some(bytes), _) => sink.write(bytes).map(|_| ()),
            (None, Some(f)) => body_conn.relay_body(f, &mut sink),
            // A body whose length cannot be told (two lengths) is not sent: envd refuses the
            // head, and the connection ends after its answer.
            (None, None) => Ok(()),
        };
        if sent.is_err() {
            // The client went (or broke its framing) before its body was whole: envd sees it go.
            let _ = to_node.shutdown(std::net::Shutdown::Both);
        }
        (body_conn, sent.is_ok())
    };
    let sender = std::thread::Builder::new()
        .stack_size(procs::STACK)
        .spawn(send_body);
    let Ok(sender) = sender else {
        // No thread to be had: the request is not sent (the sandbox's process limit).
        unavailable(
            &mut conn.stream,
            "envd's front has no thread for the request (the sandbox's process limit)",
            false,
        )?;
        return Ok(false);
    };
    let body_done = |conn: &mut Conn, sender: std::thread::JoinHandle<(Conn, bool)>| -> bool {
        // Envd answers a whole body only once it has read it: the sender is then about to end.
        // One still busy after a while is reading a body envd did not wait for.
        for _ in 0..100 {
            if sender.is_finished() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if !sender.is_finished() {
            // Answered before the body was whole: the rest is not read, and the connection ends.
            let _ = conn.stream.shutdown(std::net::Shutdown::Read);
            let _ = sender.join();
            return false;
        }
        match sender.join() {
            Ok((body_conn, whole)) => {
                conn.buf = body_conn.buf;
                whole
            }
            Err(_) => false,
        }
    };
    let mut answer = Conn::new(node.try_clone()?);
    answer.watch = Some(conn.stream.as_raw_fd());
    let gone = |node: &UnixStream| {
        let _ = node.shutdown(std::net::Shutdown::Both);
        Ok(false)
    };
    let mut sender = Some(sender);
    loop {
        let raw = match answer.answer_head() {
            Ok(Some(raw)) => raw,
            Ok(None) | Err(_) => {
                let _ = node.shutdown(std::net::Shutdown::Both);
                if let Some(s) = sender.take() {
                    body_done(conn, s);
                }
                return Ok(false);
            }
        };
        let Some(reply) = Head::parse(raw) else {
            let _ = node.shutdown(std::net::Shutdown::Both);
            if let Some(s) = sender.take() {
                body_done(conn, s);
            }
            return Ok(false);
        };
        conn.stream.write_all(&reply.raw)?;
        let status = reply.status();
        if status == 101 {
            // An upgrade (a forwarded port's WebSocket): bytes both ways until either side ends.
            // Its request had no body: the sender is done.
            if let Some(s) = sender.take() {
                if !body_done(conn, s) {
                    return gone(&node);
                }
            }
            let mut up = conn.stream.try_clone()?;
            let mut to_node = node.try_clone()?;
            let pending = std::mem::take(&mut conn.buf);
            let upstream = move || {
                let _ = to_node.write_all(&pending);
                let _ = io::copy(&mut up, &mut to_node);
                let _ = to_node.shutdown(std::net::Shutdown::Write);
            };
            if procs::spawn(upstream).is_err() {
                return Ok(false);
            }
            answer.watch = None;
            conn.stream.write_all(&answer.buf)?;
            let _ = io::copy(&mut answer.stream, &mut conn.stream);
            let _ = conn.stream.shutdown(std::net::Shutdown::Write);
            return Ok(false);
        }
        if (100..200).contains(&status) {
            continue;
        }
        let out = reply.answer_framing(&head.first[0]);
        let relayed = answer.relay_body(out, &mut conn.stream).is_ok();
        let whole = sender.take().map(|s| body_done(conn, s)).unwrap_or(false);
        if !relayed {
            return gone(&node);
        }
        let node_keeps = !reply
            .fields
            .iter()
            .any(|(n, v)| n == "connection" && v.eq_ignore_ascii_case("close"));
        return Ok(keep && whole && framing.is_some() && out != Framing::UntilEnd && node_keeps);
    }
}

/// Hands bytes that are no request the front can read (a malformed head) to Node's envd, whose
/// parser refuses them in the contract's shape, and its answer back; the connection then ends.
fn forward_raw(front: &Arc<Front>, conn: &mut Conn, bytes: &[u8]) -> io::Result<()> {
    let mut node = match connect_node(front) {
        Ok(s) => s,
        Err(message) => return unavailable(&mut conn.stream, &message, false),
    };
    let _ = node.write_all(bytes);
    let mut answer = Conn::new(node);
    answer.watch = Some(conn.stream.as_raw_fd());
    let _ = answer.relay_body(Framing::UntilEnd, &mut conn.stream);
    Ok(())
}

/// Hands a request to Node's envd and reads its answer whole: (status, body as text).
fn forward_whole(front: &Arc<Front>, head: &Head, body: &[u8]) -> Result<(u16, String), String> {
    let mut node = connect_node(front)?;
    let fail = |e: io::Error| format!("envd did not answer: {}", e);
    let mut raw = head.raw.clone();
    // Node's framing of the body as read here: a length.
    if let Some(at) = http::find(&raw, b"\r\n") {
        let mut rest: Vec<u8> = Vec::new();
        for line in raw[at + 2..].split(|b| *b == b'\n') {
            let l = String::from_utf8_lossy(line).to_ascii_lowercase();
            if l.starts_with("content-length:")
                || l.starts_with("transfer-encoding:")
                || l.trim().is_empty()
            {
                continue;
            }
            rest.extend_from_slice(line);
            rest.push(b'\n');
        }
        let mut out = raw[..at + 2].to_vec();
        out.extend_from_slice(&rest);
        out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
        raw = out;
    }
    node.write_all(&raw)
        .and_then(|_| node.write_all(body))
        .map_err(fail)?;
    let mut answer = Conn::new(node);
    loop {
        let reply = answer
            .answer_head()
            .map_err(fail)?
            .and_then(Head::parse)
            .ok_or("envd closed the connection")?;
        if reply.status() < 200 {
            continue;
        }
        let mut text = Vec::new();
        answer
            .relay_body(reply.answer_framing(&head.first[0]), &mut text)
            .map_err(fail)?;
        if reply.has_chunked() {
            // relay_body copies the framing as it came: take the chunks' data out.
            let mut c = Conn {
                stream: UnixStream::pair().map_err(fail)?.0,
                buf: text,
                watch: None,
            };
            text = c
                .chunked(usize::MAX)
                .map_err(fail)?
                .map(|(b, _)| b)
                .unwrap_or_default();
        }
        return Ok((reply.status(), String::from_utf8_lossy(&text).into_owned()));
    }
}
