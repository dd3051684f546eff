package testenv

import (
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Gate is a network link that a test cuts and heals: the Relays it makes
// (for Proxy) pass traffic through while the gate is open, and while it is
// shut they take each chunk in and hold it, so the sender's writes
// succeed as they would into a network, and nothing arrives. Opening the
// gate delivers what was held, in order, late: a partition that heals, or
// a packet delay as long as the gate stayed shut. One Gate may serve many
// connections and both directions. A Gate is safe for concurrent use; a
// new one is open.
type Gate struct {
	mu     sync.Mutex
	opened chan struct{} // closed while the gate is open
	held   atomic.Int64
}

// NewGate returns an open Gate.
func NewGate() *Gate {
	g := &Gate{opened: make(chan struct{})}
	close(g.opened)
	return g
}

// Shut cuts the link: from now on every chunk is held.
func (g *Gate) Shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.opened:
		g.opened = make(chan struct{})
	default: // already shut
	}
}

// Open heals the link: the held chunks are delivered, in order per
// connection and direction, and new ones pass through.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.opened:
	default:
		close(g.opened)
	}
}

// Held is the number of chunks held right now, one at most per connection
// and direction: a probe that a sender's traffic is stuck in the gate.
func (g *Gate) Held() int { return int(g.held.Load()) }

func (g *Gate) wait() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.opened
}

// Relay returns a Relay that copies src to dst chunk by chunk, holding
// each chunk while the gate is shut. It also ends when dst is closed
// while it holds a chunk (Proxy's cleanup closes every connection), so a
// test that ends with the gate shut does not hang.
func (g *Gate) Relay() Relay {
	return func(dst io.Writer, src io.Reader) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if !g.pass(dst) {
					return
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
}

// pass waits until the gate is open; false if dst was closed meanwhile.
func (g *Gate) pass(dst io.Writer) bool {
	opened := g.wait()
	select {
	case <-opened:
		return true
	default:
	}
	g.held.Add(1)
	defer g.held.Add(-1)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-opened:
			return true
		case <-tick.C:
			// A write of no bytes fails only on a connection closed on
			// this side.
			if _, err := dst.Write(nil); err != nil {
				return false
			}
		}
	}
}
