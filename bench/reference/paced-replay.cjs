// A replay server as slow as a given server: answers each request with the bytes recorded for its
// method and path (a JSON file: {"POST /files": {status, headers, body (base64)}}), after spinning
// the CPU for DELAY_MS once the request's body is in, as a server that works that long would.
// Usage: node paced-replay.cjs ANSWERS.json DELAY_MS
const { readFileSync } = require('node:fs');
const { createServer } = require('node:http');

const answers = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const delayMs = Number(process.argv[3]);
const server = createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    const answer = answers[`${req.method} ${(req.url ?? '').split('?')[0]}`];
    if (!answer) {
      res.writeHead(404, { 'content-length': 0 }).end();
      return;
    }
    const until = performance.now() + delayMs;
    while (performance.now() < until) {
      // working, as the paced server would
    }
    const body = Buffer.from(answer.body, 'base64');
    res.writeHead(answer.status, { ...answer.headers, 'content-length': body.length });
    res.end(body);
  });
});
server.listen(0, '127.0.0.1', () => {
  console.log(JSON.stringify({ event: 'listening', port: server.address().port }));
});
