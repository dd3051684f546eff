package testenv

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// Relay copies one direction of a proxied connection, from src to dst,
// until src ends or a write fails.
type Relay func(dst io.Writer, src io.Reader)

// Proxy puts a TCP proxy on loopback in front of dsn's host and returns
// the DSN that goes through it: up relays what the client sends, down what
// the server answers (nil: copy as is). Each connection is closed when
// either direction ends. The test's cleanup closes everything and waits
// for the relays; register it before the pools that use the proxy, so it
// runs after they have closed.
func Proxy(t testing.TB, dsn string, up, down Relay) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.Host = ln.Addr().String()
	copyAs := func(r Relay) Relay {
		if r != nil {
			return r
		}
		return func(dst io.Writer, src io.Reader) { _, _ = io.Copy(dst, src) }
	}
	up, down = copyAs(up), copyAs(down)
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	pipe := func(r Relay, dst, src net.Conn) {
		defer wg.Done()
		r(dst, src)
		dst.Close()
		src.Close()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			wg.Add(2)
			go pipe(up, server, client)
			go pipe(down, client, server)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return u.String()
}

// Delay is a Relay that hands each chunk on d after it arrived, in order,
// as a network with a one-way latency of d would (bandwidth is not
// limited). time.Sleep's overshoot, tens of microseconds, adds to d.
func Delay(d time.Duration) Relay {
	type chunk struct {
		at   time.Time
		data []byte
	}
	return func(dst io.Writer, src io.Reader) {
		queue := make(chan chunk, 1024)
		go func() {
			defer close(queue)
			for {
				buf := make([]byte, 32<<10)
				n, err := src.Read(buf)
				if n > 0 {
					queue <- chunk{time.Now().Add(d), buf[:n]}
				}
				if err != nil {
					return
				}
			}
		}()
		for c := range queue {
			time.Sleep(time.Until(c.at))
			if _, err := dst.Write(c.data); err != nil {
				for range queue { // let the reader finish
				}
				return
			}
		}
	}
}
