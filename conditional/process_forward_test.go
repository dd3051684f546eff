package conditional_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
)

// A forwarded sale (saleProc.forward): the processes of a group pass
// their takes to the group's writer process over a Unix socket, and the
// writer's Stock coalesces them with its own clients' takes on the
// group's bucket. No library: what a design costs that moves the takes of
// several processes into one writer, without what a real one needs (a
// writer chosen and replaced when it dies, an answer for the takes it
// held), to compare with homes and bound.
//
// A process has one message in flight: a uint32 count n of takes, which
// the writer answers once all n are answered, with n status bytes
// (fwdTaken, fwdSoldOut, fwdFailed). The takes that queued meanwhile go
// in the next message. (internal/combine does the same inside a process,
// but runs an idle key's first request at once, which here would send
// one take per message.)

const (
	fwdTaken byte = iota
	fwdSoldOut
	fwdFailed
)

// serveForwarded accepts the connections of remotes processes on ln and answers their
// takes with take, each in a goroutine of its own so that the Stock
// coalesces them. wait returns once every remote has closed its side and
// been answered.
func serveForwarded(t *testing.T, ln net.Listener, remotes int, take func(context.Context) (bool, error)) (wait func()) {
	var wg sync.WaitGroup
	wg.Add(remotes)
	for range remotes {
		go func() {
			defer wg.Done()
			conn, err := ln.Accept()
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			if err := serveRemote(conn, take); err != nil {
				t.Error(err)
			}
		}()
	}
	return wg.Wait
}

// serveRemote answers one remote's messages until it closes its side.
func serveRemote(conn net.Conn, take func(context.Context) (bool, error)) error {
	r := bufio.NewReader(conn)
	for {
		var n uint32
		if err := binary.Read(r, binary.BigEndian, &n); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		status := make([]byte, n)
		var takes sync.WaitGroup
		for i := range status {
			takes.Add(1)
			go func() {
				defer takes.Done()
				switch ok, err := take(context.Background()); {
				case err != nil:
					status[i] = fwdFailed
				case ok:
					status[i] = fwdTaken
				default:
					status[i] = fwdSoldOut
				}
			}()
		}
		takes.Wait()
		if _, err := conn.Write(status); err != nil {
			return err
		}
	}
}

// forwardTo connects to the writer at path and returns the process's take
// and a close that ends the connection once every take is answered.
func forwardTo(t *testing.T, path string) (take func(context.Context) (bool, error), closeFn func()) {
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	reqs := make(chan chan byte, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := sendTakes(conn, reqs); err != nil {
			t.Error(err)
			for answer := range reqs { // until closeFn
				answer <- fwdFailed
			}
		}
	}()
	take = func(ctx context.Context) (bool, error) {
		answer := make(chan byte, 1)
		reqs <- answer
		switch <-answer {
		case fwdTaken:
			return true, nil
		case fwdSoldOut:
			return false, nil
		}
		return false, errors.New("the writer failed a take")
	}
	return take, func() {
		close(reqs)
		<-done
		conn.Close()
	}
}

// sendTakes sends the takes queued on reqs as one message, hands out the
// answers and repeats, until reqs is closed. A take it cannot send or
// answer is answered fwdFailed.
func sendTakes(conn net.Conn, reqs chan chan byte) error {
	r := bufio.NewReader(conn)
	for first := range reqs {
		runtime.Gosched() // let the other clients queue: one message carries them all
		batch := []chan byte{first}
		for more := true; more; {
			select {
			case answer, ok := <-reqs:
				if ok {
					batch = append(batch, answer)
				}
				more = ok
			default:
				more = false
			}
		}
		status := make([]byte, len(batch))
		_, err := conn.Write(binary.BigEndian.AppendUint32(nil, uint32(len(batch))))
		if err == nil {
			_, err = io.ReadFull(r, status)
		}
		if err != nil {
			for _, answer := range batch {
				answer <- fwdFailed
			}
			return err
		}
		for i, answer := range batch {
			answer <- status[i]
		}
	}
	return nil
}
