package leaderjob

import (
	"io"
	"net"
	"strconv"
	"sync"
)

// freezer is a TCP proxy on loopback whose traffic can be frozen: while
// frozen, bytes it reads either way are held, and delivered in order once
// it thaws, as a stopped VM or a network that holds packets would deliver
// them late.
type freezer struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	thawed *sync.Cond
	frozen bool
	conns  []net.Conn
	closed bool
}

func newFreezer(target string) (*freezer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &freezer{ln: ln, target: target}
	f.thawed = sync.NewCond(&f.mu)
	go f.accept()
	return f, nil
}

// Host and Port are the proxy's address.
func (f *freezer) Host() string { return "127.0.0.1" }

func (f *freezer) Port() uint16 {
	_, port, _ := net.SplitHostPort(f.ln.Addr().String())
	p, _ := strconv.Atoi(port)
	return uint16(p)
}

// Freeze holds all traffic from now on; Thaw delivers it and lets it flow.
func (f *freezer) Freeze() { f.set(true) }
func (f *freezer) Thaw()   { f.set(false) }

func (f *freezer) set(frozen bool) {
	f.mu.Lock()
	f.frozen = frozen
	f.mu.Unlock()
	f.thawed.Broadcast()
}

// Close stops accepting, thaws, and closes every connection.
func (f *freezer) Close() {
	f.mu.Lock()
	f.closed, f.frozen = true, false
	conns := f.conns
	f.mu.Unlock()
	f.thawed.Broadcast()
	_ = f.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (f *freezer) accept() {
	for {
		client, err := f.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", f.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		f.conns = append(f.conns, client, server)
		f.mu.Unlock()
		go f.pipe(server, client)
		go f.pipe(client, server)
	}
}

// pipe copies from src to dst, holding what it read while frozen.
func (f *freezer) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		f.mu.Lock()
		for f.frozen {
			f.thawed.Wait()
		}
		f.mu.Unlock()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				_ = src.Close()
			}
			return
		}
	}
}
