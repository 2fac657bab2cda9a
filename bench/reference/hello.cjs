// The floor: a bare node:http server that answers every request with a fixed JSON body.
const { createServer } = require('node:http');

const body = JSON.stringify({ result: 3 });
const server = createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
    res.end(body);
  });
});
server.listen(0, '127.0.0.1', () => {
  console.log(JSON.stringify({ event: 'listening', port: server.address().port }));
});
