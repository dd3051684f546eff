package testenv

import (
	"bytes"
	"encoding/binary"
	"io"
	"sync/atomic"
)

// ReplyDropper is the server-to-client Relay of a Proxy in front of
// PostgreSQL. Once armed, it swallows the next CommandComplete message
// whose tag is the one it was made for, and closes that connection: the
// server has done the work (for "COMMIT", or a statement outside a
// transaction such as "INSERT 0 1", committed it), and the client never
// hears of it. Other messages pass as they are. It is safe for concurrent
// use; give each proxy its own to know which call it cut.
type ReplyDropper struct {
	tag     []byte
	armed   atomic.Bool
	dropped atomic.Int64
}

// DropReply returns a ReplyDropper for CommandComplete messages tagged tag.
func DropReply(tag string) *ReplyDropper {
	return &ReplyDropper{tag: append([]byte(tag), 0)}
}

// Arm makes the dropper swallow the next reply tagged with its tag.
func (d *ReplyDropper) Arm() { d.armed.Store(true) }

// Dropped returns how many replies the dropper swallowed.
func (d *ReplyDropper) Dropped() int64 { return d.dropped.Load() }

// Relay copies the server's messages (a type byte, a 4-byte length that
// counts itself, the body) to the client, except the armed drop.
func (d *ReplyDropper) Relay(client io.Writer, server io.Reader) {
	var head [5]byte
	for {
		if _, err := io.ReadFull(server, head[:]); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(head[1:])-4)
		if _, err := io.ReadFull(server, body); err != nil {
			return
		}
		if head[0] == 'C' && bytes.Equal(body, d.tag) && d.armed.CompareAndSwap(true, false) {
			d.dropped.Add(1)
			return
		}
		if _, err := client.Write(append(head[:], body...)); err != nil {
			return
		}
	}
}
