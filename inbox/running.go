package inbox

import (
	"slices"
	"strings"
	"sync"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/parkedhttp"
)

// running is what the Inbox's Runs learnt from their Readers, for
// ParkedHandler's consumer call: kept in memory only, safe for concurrent
// use.
type running struct {
	mu   sync.Mutex
	live map[*partitions]readerInfo
	last readerInfo // the last Run's, kept once it returned
}

// readerInfo is what a Run knows of its Reader's settings.
type readerInfo struct {
	group, isolation string
	topics           []string
}

// newReaderInfo reads r's settings when it has a Config() (a *kafka.Reader
// does); otherwise they are unknown.
func newReaderInfo(r Reader) readerInfo {
	kr, ok := r.(interface{ Config() kafka.ReaderConfig })
	if !ok {
		return readerInfo{isolation: parkedhttp.IsolationUnknown}
	}
	rc := kr.Config()
	info := readerInfo{group: rc.GroupID, isolation: parkedhttp.Isolation(rc.IsolationLevel), topics: slices.Clone(rc.GroupTopics)}
	if rc.Topic != "" {
		info.topics = append(info.topics, rc.Topic)
	}
	return info
}

func (rs *running) start(p *partitions, info readerInfo) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.live == nil {
		rs.live = map[*partitions]readerInfo{}
	}
	rs.live[p] = info
}

func (rs *running) stop(p *partitions) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.last = rs.live[p]
	delete(rs.live, p)
}

// describe tells the inbox as its Runs read: those running, merged
// (the least safe isolation level of theirs: unknown, then read
// uncommitted), or else the last one's settings.
func (in *Inbox) describe() parkedhttp.Consumer {
	rs := &in.running
	rs.mu.Lock()
	defer rs.mu.Unlock()
	c := parkedhttp.Consumer{Kind: parkedhttp.KindInbox, Name: in.consumer, Running: len(rs.live) > 0}
	infos := []readerInfo{rs.last}
	if c.Running {
		infos = infos[:0]
		for p, info := range rs.live {
			infos = append(infos, info)
			c.Partitions += int(p.met.Load())
		}
	}
	var groups []string
	for _, info := range infos {
		c.Topics = append(c.Topics, info.topics...)
		if info.group != "" {
			groups = append(groups, info.group)
		}
		if c.IsolationLevel == "" || isolationRank(info.isolation) > isolationRank(c.IsolationLevel) {
			c.IsolationLevel = info.isolation
		}
	}
	if c.IsolationLevel == "" {
		c.IsolationLevel = parkedhttp.IsolationUnknown // no Run yet
	}
	slices.Sort(groups)
	slices.Sort(c.Topics)
	c.Group, c.Topics = strings.Join(slices.Compact(groups), ","), slices.Compact(c.Topics)
	return c
}

// isolationRank orders isolation levels by how much they cost: read
// committed nothing; read uncommitted waits on open transactions; unknown
// (a Reader without Config) cannot tell aborted records at all.
func isolationRank(level string) int {
	switch level {
	case parkedhttp.ReadCommitted:
		return 0
	case parkedhttp.ReadUncommitted:
		return 1
	}
	return 2
}
