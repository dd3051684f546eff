// Package parkedhttp serves one consumer's parked messages as JSON over
// HTTP: the implementation behind inbox.ParkedHandler and
// partition.ParkedHandler, and the protocol `nolock parked -service`
// speaks.
//
// Relative to where the handler is mounted, the last path element picks
// the call; a path ending in "/" lists:
//
//	GET  .../?after=ID&limit=N        a page of parked messages: Page
//	POST .../replay?id=ID             replay one through the service's handler
//	POST .../purge?id=ID              purge one
//	POST .../purge?older_than=DUR     purge those parked longer ago than DUR
//	GET  .../consumer                 the consumer as it runs in this process: Consumer
//
// Failures are an Error with a status: 400 invalid, 404 not parked,
// 405 wrong method (list and consumer are GET, the others POST), 422 the
// handler failed the replay, 500 otherwise.
package parkedhttp

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/kafkapark"
)

// PreviewBytes bounds the value shown of each message.
const PreviewBytes = 256

// MaxLimit bounds a page.
const MaxLimit = 1000

// Message is one parked message as listed: its id, why and when it was
// parked, its key and a preview of its value.
type Message struct {
	ID        string    `json:"id"` // topic/partition@offset
	Topic     string    `json:"topic"`
	Partition int       `json:"partition"`
	Offset    int64     `json:"offset"`
	ParkedAt  time.Time `json:"parked_at"`
	Attempts  int       `json:"attempts"`
	Error     string    `json:"error"`
	Key       string    `json:"key"`                  // its first PreviewBytes, as text, bad bytes as U+FFFD
	Value     string    `json:"value"`                // its first PreviewBytes, as text
	ValueSize int       `json:"value_bytes"`          // the whole value's size
	MessageID string    `json:"message_id,omitempty"` // inbox's identity
	Epoch     int64     `json:"epoch,omitempty"`      // partition's claim
}

// Summary is m, parked with attempts and errText at parkedAt, as listed.
func Summary(m kafka.Message, parkedAt time.Time, attempts int, errText, messageID string, epoch int64) Message {
	id := kafkapark.ID{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
	return Message{
		ID: id.String(), Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
		ParkedAt: parkedAt, Attempts: attempts, Error: errText,
		Key: preview(m.Key), Value: preview(m.Value), ValueSize: len(m.Value),
		MessageID: messageID, Epoch: epoch,
	}
}

// preview is b's first PreviewBytes as text, without cutting a rune in
// two; bytes that are not UTF-8 become U+FFFD.
func preview(b []byte) string {
	if len(b) > PreviewBytes {
		b = b[:PreviewBytes]
		for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
			if utf8.RuneStart(b[len(b)-i]) {
				if !utf8.FullRune(b[len(b)-i:]) {
					b = b[:len(b)-i]
				}
				break
			}
		}
	}
	return kafkapark.Text(string(b))
}

// Page is a list answer: Next is the id to pass as after for the next
// page, empty after the last.
type Page struct {
	Messages []Message `json:"messages"`
	Next     string    `json:"next,omitempty"`
}

// Replayed and Purged are the answers of replay and purge.
type (
	Replayed struct {
		Replayed string `json:"replayed"`
	}
	Purged struct {
		Purged int64 `json:"purged"`
	}
)

// Consumer is the consumer call's answer: the consumer as it runs in the
// process serving the handler, for `nolock doctor -service`.
type Consumer struct {
	Kind string `json:"kind"` // KindInbox or KindPartition
	// Name is the inbox's consumer name (inbox.New's consumer) or the
	// partition consumer's group.
	Name string `json:"name"`
	// Group is the Kafka consumer group the messages are read with: the
	// inbox Reader's GroupID (empty when it has none or is not known), the
	// partition consumer's group.
	Group  string   `json:"group,omitempty"`
	Topics []string `json:"topics"`
	// IsolationLevel is what the consumer's fetches ask Kafka for: one of
	// the Isolation constants.
	IsolationLevel string `json:"isolation_level"`
	// Running tells whether Run is running now. When it is not, an
	// inbox's Topics, Group and IsolationLevel are its last Run's (unknown
	// before the first).
	Running bool `json:"running"`
	// Partitions counts the partitions being worked on: the partition
	// consumer's owned now; an inbox's, those its running Runs have met
	// messages of since they began (a Reader with a GroupID does not say
	// which it holds now).
	Partitions int `json:"partitions"`
}

// The kinds of Consumer.
const (
	KindInbox     = "inbox"
	KindPartition = "partition"
)

// The isolation levels of Consumer.
const (
	ReadCommitted    = "read_committed"
	ReadUncommitted  = "read_uncommitted"
	IsolationUnknown = "unknown"
)

// Isolation names l as Consumer.IsolationLevel does.
func Isolation(l kafka.IsolationLevel) string {
	if l == kafka.ReadCommitted {
		return ReadCommitted
	}
	return ReadUncommitted
}

// Error is a failure's answer. Code is one of the Code constants.
type Error struct {
	Code  string `json:"code"`
	Error string `json:"error"`
}

// The codes of Error.
const (
	CodeInvalid       = "invalid"
	CodeNotParked     = "not_parked"
	CodeMethod        = "method_not_allowed"
	CodeHandlerFailed = "handler_failed"
	CodeAmbiguous     = "ambiguous_commit"
	CodeInternal      = "internal"
)

// Backend is one consumer's parked calls, as its package makes them.
type Backend struct {
	List       func(ctx context.Context, after kafkapark.ID, limit int) ([]Message, error)
	Replay     func(ctx context.Context, id kafkapark.ID) error
	Purge      func(ctx context.Context, id kafkapark.ID) error
	PurgeOlder func(ctx context.Context, d time.Duration) (int64, error)
	Consumer   func() Consumer
	// The package's sentinels, and whether an error is its HandlerError.
	Invalid, NotParked, Ambiguous error
	HandlerFailed                 func(error) bool
}

// Handler serves b (see the package doc).
func Handler(b Backend) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		// A path ending in "/" is the mount point itself (a handler
		// mounted at .../consumer/ lists).
		op := path.Base(r.URL.Path)
		if strings.HasSuffix(r.URL.Path, "/") || op != "replay" && op != "purge" && op != "consumer" {
			op = "list"
		}
		get := op == "list" || op == "consumer"
		if get != (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			want := http.MethodPost
			if get {
				want = http.MethodGet
			}
			w.Header().Set("Allow", want)
			write(w, http.StatusMethodNotAllowed, Error{CodeMethod, op + " takes " + want})
			return
		}
		switch op {
		case "list":
			b.list(w, r.Context(), q.Get("after"), q.Get("limit"))
		case "consumer":
			c := b.Consumer()
			if c.Topics == nil {
				c.Topics = []string{}
			}
			write(w, http.StatusOK, c)
		case "replay":
			id, ok := parseID(w, q.Get("id"))
			if ok {
				b.answer(w, b.Replay(r.Context(), id), Replayed{id.String()})
			}
		case "purge":
			b.purge(w, r.Context(), q.Get("id"), q.Get("older_than"))
		}
	})
}

func (b Backend) list(w http.ResponseWriter, ctx context.Context, after, limit string) {
	n := 100
	if limit != "" {
		var err error
		if n, err = strconv.Atoi(limit); err != nil || n < 1 || n > MaxLimit {
			write(w, http.StatusBadRequest, Error{CodeInvalid, "limit " + strconv.Quote(limit) + " is not a number from 1 to " + strconv.Itoa(MaxLimit)})
			return
		}
	}
	var from kafkapark.ID
	if after != "" {
		var ok bool
		if from, ok = parseID(w, after); !ok {
			return
		}
	}
	ms, err := b.List(ctx, from, n)
	if err != nil {
		b.answer(w, err, nil)
		return
	}
	p := Page{Messages: ms}
	if p.Messages == nil {
		p.Messages = []Message{}
	}
	if len(ms) == n {
		p.Next = ms[n-1].ID
	}
	write(w, http.StatusOK, p)
}

func (b Backend) purge(w http.ResponseWriter, ctx context.Context, id, olderThan string) {
	switch {
	case (id == "") == (olderThan == ""):
		write(w, http.StatusBadRequest, Error{CodeInvalid, "purge takes either id or older_than"})
	case id != "":
		pid, ok := parseID(w, id)
		if ok {
			b.answer(w, b.Purge(ctx, pid), Purged{1})
		}
	default:
		d, err := time.ParseDuration(olderThan)
		if err != nil || d <= 0 {
			write(w, http.StatusBadRequest, Error{CodeInvalid, "older_than " + strconv.Quote(olderThan) + " is not a positive Go duration"})
			return
		}
		n, err := b.PurgeOlder(ctx, d)
		b.answer(w, err, Purged{n})
	}
}

func parseID(w http.ResponseWriter, s string) (kafkapark.ID, bool) {
	id, err := kafkapark.Parse(s)
	if err != nil {
		write(w, http.StatusBadRequest, Error{CodeInvalid, "id: " + err.Error()})
		return kafkapark.ID{}, false
	}
	return id, true
}

// answer writes ok, or err's Error.
func (b Backend) answer(w http.ResponseWriter, err error, ok any) {
	switch {
	case err == nil:
		write(w, http.StatusOK, ok)
	case errors.Is(err, b.Invalid):
		write(w, http.StatusBadRequest, Error{CodeInvalid, err.Error()})
	case errors.Is(err, b.NotParked):
		write(w, http.StatusNotFound, Error{CodeNotParked, err.Error()})
	case b.HandlerFailed(err):
		write(w, http.StatusUnprocessableEntity, Error{CodeHandlerFailed, err.Error()})
	case errors.Is(err, b.Ambiguous):
		write(w, http.StatusInternalServerError, Error{CodeAmbiguous, err.Error()})
	default:
		write(w, http.StatusInternalServerError, Error{CodeInternal, err.Error()})
	}
}

func write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client went away: nothing to do
}
