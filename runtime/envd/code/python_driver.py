"""envd's Python code-context driver (standard library only).

Started once per context as `python3 -u python_driver.py`. Requests arrive as JSON lines on
stdin: {"code": "...", "env": {...}}. Events leave as JSON lines on the original stdout, which
nothing else writes to: sys.stdout/sys.stderr become writers that emit events (so prints keep
their order with results and errors), and fds 1 and 2 become pipes this driver reads, so what
subprocesses write is captured too and flushed before the cell's `end`.
"""

import ast
import base64
import fcntl
import json
import linecache
import os
import select
import signal
import sys
import termios
import threading
import traceback
import struct

_CHANNEL = os.dup(1)
_REQUESTS = os.fdopen(os.dup(0), "rb")
_lock = threading.RLock()


class _State:
    user = False  # running user code: SIGINT may raise KeyboardInterrupt
    emitting = False  # writing an event: a SIGINT waits until the line is whole
    pending = False


_state = _State()


def _on_sigint(signum, frame):
    if _state.user and not _state.emitting:
        raise KeyboardInterrupt
    _state.pending = _state.user


signal.signal(signal.SIGINT, _on_sigint)


def send(event):
    data = (json.dumps(event, default=str) + "\n").encode("utf-8")
    main = threading.current_thread() is threading.main_thread()
    if main:
        _state.emitting = True
    try:
        with _lock:
            while data:
                data = data[os.write(_CHANNEL, data):]
    finally:
        if main:
            _state.emitting = False
    if main and _state.pending and _state.user:
        _state.pending = False
        raise KeyboardInterrupt


class _EventWriter:
    """sys.stdout / sys.stderr: every write is an event, in the order written."""

    def __init__(self, name):
        self.name = name
        self.encoding = "utf-8"
        self.errors = "replace"

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if text:
            for pipe in _pipes:  # what subprocesses wrote before this comes first
                pipe.drain()
            send({"type": self.name, "text": text})
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        pass

    def isatty(self):
        return False

    def writable(self):
        return True

    def fileno(self):
        return 1 if self.name == "stdout" else 2


class _FdPipe:
    """Fd 1 or 2 made a pipe; a thread turns what subprocesses write there into events."""

    def __init__(self, fd, name):
        read, write = os.pipe()
        os.dup2(write, fd)
        os.close(write)
        os.set_blocking(read, False)
        self.read_fd = read
        self.name = name
        threading.Thread(target=self._follow, daemon=True).start()

    def _pump(self):
        try:
            data = os.read(self.read_fd, 65536)
        except BlockingIOError:
            return False
        if data:
            send({"type": self.name, "text": data.decode("utf-8", "replace")})
        return bool(data)

    def _follow(self):
        while True:
            select.select([self.read_fd], [], [])
            with _lock:
                self._pump()

    def drain(self):
        """Emits everything written so far (called before `end`)."""
        with _lock:
            while self._available() and self._pump():
                pass

    def _available(self):
        buf = fcntl.ioctl(self.read_fd, termios.FIONREAD, struct.pack("i", 0))
        return struct.unpack("i", buf)[0] > 0


sys.stdin = open(os.devnull)
os.dup2(sys.stdin.fileno(), 0)
_pipes = [_FdPipe(1, "stdout"), _FdPipe(2, "stderr")]
sys.stdout = _EventWriter("stdout")
sys.stderr = _EventWriter("stderr")

_FORMATS = [
    ("html", "_repr_html_"),
    ("markdown", "_repr_markdown_"),
    ("svg", "_repr_svg_"),
    ("png", "_repr_png_"),
    ("jpeg", "_repr_jpeg_"),
    ("pdf", "_repr_pdf_"),
    ("latex", "_repr_latex_"),
    ("json", "_repr_json_"),
    ("javascript", "_repr_javascript_"),
]


def _formats(value):
    data = {"text": repr(value)}
    for key, method in _FORMATS:
        fn = getattr(value, method, None)
        if not callable(fn) or isinstance(value, type):
            continue
        try:
            out = fn()
        except Exception:
            continue
        if isinstance(out, tuple):  # (data, metadata)
            out = out[0]
        if out is None:
            continue
        if isinstance(out, (bytes, bytearray)):
            out = base64.b64encode(out).decode("ascii")
        data[key] = out
    return data


def display(*objects):
    """Shows objects as results of the cell (not its main result)."""
    for obj in objects:
        send({"type": "result", "is_main_result": False, **_formats(obj)})


def _figures(close=True):
    """Every open matplotlib figure as a PNG result, then closed (when the user imported it)."""
    if "matplotlib.pyplot" not in sys.modules:
        return
    import io

    plt = sys.modules["matplotlib.pyplot"]
    for num in plt.get_fignums():
        fig = plt.figure(num)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        send(
            {
                "type": "result",
                "is_main_result": False,
                "text": repr(fig),
                "png": base64.b64encode(buf.getvalue()).decode("ascii"),
            }
        )
        if close:
            plt.close(fig)


def _patch_show():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or getattr(plt.show, "_abx", False):
        return

    def show(*args, **kwargs):
        _figures()

    show._abx = True
    plt.show = show


_namespace = {"__name__": "__main__", "__builtins__": __builtins__, "display": display}
_cells = 0


def _traceback(error):
    """The exception's traceback without this driver's own frames."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def _run(code):
    global _cells
    _cells += 1
    filename = f"<cell {_cells}>"
    # Tracebacks then show the cell's lines.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename=filename, mode="exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), _namespace)
    _patch_show()
    value = None
    if last is not None:
        value = eval(compile(last, filename, "eval"), _namespace)
        _patch_show()
    if value is not None:
        send({"type": "result", "is_main_result": True, **_formats(value)})


def _handle(request):
    count = request.get("execution_count", 0)
    os.environ.update(request.get("env") or {})
    _state.pending = False
    _state.user = True
    try:
        _run(request.get("code", ""))
    except BaseException as error:  # user code may raise anything, SystemExit included
        _state.user = False
        send(
            {
                "type": "error",
                "name": type(error).__name__,
                "value": str(error),
                "traceback": _traceback(error),
            }
        )
    finally:
        _state.user = False
    try:
        _figures()  # also after an error, as Jupyter's inline backend does
    except Exception as error:
        send({"type": "error", "name": type(error).__name__, "value": str(error), "traceback": ""})
    for pipe in _pipes:
        pipe.drain()
    send({"type": "end", "execution_count": count})


def main():
    os.environ.setdefault("MPLBACKEND", "Agg")
    while True:
        try:
            line = _REQUESTS.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return
        try:
            request = json.loads(line)
        except ValueError as error:
            send({"type": "error", "name": "ValueError", "value": str(error), "traceback": ""})
            send({"type": "end", "execution_count": 0})
            continue
        _handle(request)


main()
