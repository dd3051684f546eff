package testenv

import (
	"io"
	"sync"
)

// Cutter cuts the connections of a Proxy: Cut closes, at once and both
// ways, every connection whose relays it wraps, as a network partition or
// a crashed middlebox would; what was in flight is lost. Connections made
// later pass as usual. A Cutter is safe for concurrent use.
type Cutter struct {
	mu    sync.Mutex
	conns map[*cutEnds]struct{}
}

type cutEnds struct{ dst, src any }

// NewCutter returns a Cutter.
func NewCutter() *Cutter { return &Cutter{conns: map[*cutEnds]struct{}{}} }

// Wrap returns r (nil: copy as is), whose connections Cut closes.
func (c *Cutter) Wrap(r Relay) Relay {
	if r == nil {
		r = func(dst io.Writer, src io.Reader) { _, _ = io.Copy(dst, src) }
	}
	return func(dst io.Writer, src io.Reader) {
		e := &cutEnds{dst, src}
		c.mu.Lock()
		c.conns[e] = struct{}{}
		c.mu.Unlock()
		defer func() {
			c.mu.Lock()
			delete(c.conns, e)
			c.mu.Unlock()
		}()
		r(dst, src)
	}
}

// Cut closes every connection open through the Cutter now, and returns
// how many ends it closed.
func (c *Cutter) Cut() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for e := range c.conns {
		for _, end := range []any{e.dst, e.src} {
			if cl, ok := end.(io.Closer); ok && cl.Close() == nil {
				n++
			}
		}
	}
	return n
}
