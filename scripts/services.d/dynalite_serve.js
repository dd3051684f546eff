// Serve dynalite like its cli.js does, but survive a client that hangs up
// mid-request. dynalite's request handler rethrows the socket error
// (`req.on('error', err => { throw err })`), so one aborted request (a test
// cancelling a context, a killed child process) would take the whole server
// down with ECONNRESET. Such errors concern one connection only: log them
// and keep serving. Anything else still ends the process.
//
// Usage: node dynalite_serve.js <dynalite module dir> [dynalite cli flags]
const moduleDir = process.argv[2]
const argv = require(moduleDir + '/node_modules/minimist')(process.argv.slice(3))

process.on('uncaughtException', (err) => {
  if (err && (err.code === 'ECONNRESET' || err.message === 'aborted')) {
    console.error('dynalite_serve: client aborted a request:', err.message)
    return
  }
  console.error(err)
  process.exit(1)
})

const server = require(moduleDir + '/node_modules/dynalite')(argv)
// Keep an idle connection open longer than clients keep theirs (Go's
// transport: 90 s), as DynamoDB's endpoints do, rather than Node's 5 s: a
// server that closes first races the client's next request on that
// connection, which then fails with EOF, its outcome unknown.
server.keepAliveTimeout = 120 * 1000
server.headersTimeout = 121 * 1000
server.listen(argv.port || 4567, argv.host || undefined, () => {
  const address = server.address()
  console.log('Dynalite listening at: http://%s:%s', argv.host || 'localhost', address.port)
})
