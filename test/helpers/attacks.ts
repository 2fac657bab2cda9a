/**
 * Python run inside a sandbox: forks up to 150 sleeping children, counts the forks the kernel
 * refused and the processes it sees, kills and reaps them all, prints `forked refused alive`.
 */
export const FORK_BOMB = [
  'import os, signal, time',
  'children = []',
  'refused = 0',
  'for _ in range(150):',
  '    try:',
  '        pid = os.fork()',
  '    except OSError:',
  '        refused += 1',
  '        continue',
  '    if pid == 0:',
  '        time.sleep(30)',
  '        os._exit(0)',
  '    children.append(pid)',
  'alive = len([p for p in os.listdir("/proc") if p.isdigit()])',
  'for pid in children: os.kill(pid, signal.SIGKILL)',
  'for pid in children: os.waitpid(pid, 0)',
  'print(len(children), refused, alive)',
].join('\n');
