package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/kafkapark"
	"github.com/nolock/nolock/internal/parkedhttp"
	"github.com/nolock/nolock/partition"
)

// parkedConfig is a parked command line, checked before any I/O.
type parkedConfig struct {
	verb               string // list, replay or purge
	inbox, group       string // whose parked messages, reading the table directly
	table              string
	topic              string
	partition          int // -1: every partition
	postgres, service  string
	id                 kafkapark.ID // replay's and purge's
	hasID              bool
	olderThan, timeout time.Duration
	json               bool
}

func parkedCommand(fs *flag.FlagSet, stdout, stderr io.Writer) func(context.Context) int {
	var cfg parkedConfig
	fs.StringVar(&cfg.inbox, "inbox", "", "the inbox's consumer `NAME` (as given to inbox.New), reading its table from -postgres")
	fs.StringVar(&cfg.group, "group", "", "the partition consumer's `GROUP` (as given to partition.New), reading its table from -postgres")
	fs.StringVar(&cfg.table, "table", "", "the table `NAME` given to WithTable (default "+inbox.DefaultTable+" with -inbox, "+partition.DefaultTable+" with -group)")
	fs.StringVar(&cfg.topic, "topic", "", "list only this `TOPIC`'s parked messages")
	fs.IntVar(&cfg.partition, "partition", -1, "list only this partition's parked messages (`N`; -1: all)")
	postgresFlag(fs, &cfg.postgres, "where the consumer's tables are (list and purge)")
	fs.StringVar(&cfg.service, "service", "", "`URL` where your service mounts inbox.ParkedHandler or partition.ParkedHandler (needed by replay)")
	fs.DurationVar(&cfg.olderThan, "older-than", 0, "purge every message parked longer ago than this (a Go `DURATION`) instead of one ID")
	fs.DurationVar(&cfg.timeout, "timeout", 30*time.Second, "bound on the whole command (a Go `DURATION`)")
	fs.BoolVar(&cfg.json, "json", false, "print JSON: list an array of messages, replay {\"replayed\": ID}, purge {\"purged\": N}")
	return func(ctx context.Context) int {
		if msg := cfg.parse(fs); msg != "" {
			return usageError(fs, msg)
		}
		withEnvDefaults(&cfg.postgres, nil, nil)
		ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
		c, closeClient, err := cfg.client(ctx)
		if err == nil {
			defer closeClient()
			err = runParked(ctx, cfg, c, stdout)
		}
		if err != nil {
			fmt.Fprintf(stderr, "nolock parked %s: %v\n", cfg.verb, err)
			return 1
		}
		return 0
	}
}

// parse reads the verb, the flags after it and the ID; it returns what is
// wrong with them, or "".
func (cfg *parkedConfig) parse(fs *flag.FlagSet) string {
	if fs.NArg() == 0 {
		return "nolock parked needs list, replay or purge"
	}
	cfg.verb = fs.Arg(0)
	if err := fs.Parse(fs.Args()[1:]); err != nil { // flags after the verb
		return err.Error()
	}
	args := fs.Args()
	switch cfg.verb {
	case "list":
		if len(args) > 0 {
			return fmt.Sprintf("list takes no ID (%q): filter with -topic and -partition", args[0])
		}
		if cfg.olderThan != 0 {
			return "-older-than is purge's"
		}
	case "replay", "purge":
		if cfg.topic != "" || cfg.partition != -1 {
			return "-topic and -partition filter list; " + cfg.verb + " takes an ID"
		}
		switch {
		case len(args) > 1:
			return fmt.Sprintf("%s takes one ID, got %d", cfg.verb, len(args))
		case cfg.verb == "purge" && cfg.olderThan < 0:
			return fmt.Sprintf("-older-than %v must be positive", cfg.olderThan)
		case cfg.verb == "purge" && (len(args) == 1) == (cfg.olderThan > 0):
			return "purge takes either an ID or -older-than"
		case cfg.verb == "replay" && len(args) == 0:
			return "replay takes the ID of a parked message (topic/partition@offset)"
		case cfg.verb == "replay" && cfg.olderThan != 0:
			return "-older-than is purge's"
		}
		if len(args) == 1 {
			id, err := kafkapark.Parse(args[0])
			if err != nil {
				return "bad ID: " + err.Error()
			}
			cfg.id, cfg.hasID = id, true
		}
	default:
		return fmt.Sprintf("unknown verb %q: want list, replay or purge", cfg.verb)
	}
	switch {
	case cfg.partition < -1:
		return fmt.Sprintf("-partition %d is negative", cfg.partition)
	case cfg.timeout <= 0:
		return fmt.Sprintf("-timeout %v must be positive", cfg.timeout)
	case cfg.service != "":
		if cfg.inbox != "" || cfg.group != "" || cfg.table != "" {
			return "-service serves one consumer: -inbox, -group and -table are for -postgres"
		}
		if u, err := url.Parse(cfg.service); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Sprintf("-service %q is not an http:// or https:// URL", cfg.service)
		}
	case cfg.verb == "replay":
		return "replay runs your handler, so it goes through your service: give -service URL (see docs/operating.md)"
	case (cfg.inbox == "") == (cfg.group == ""):
		return "give -inbox NAME or -group GROUP (or -service URL)"
	}
	return ""
}

// client returns the parked calls cfg names: the service's over HTTP, or
// the package's own calls on the table, served in process.
func (cfg parkedConfig) client(ctx context.Context) (*parkedClient, func(), error) {
	if cfg.service != "" {
		return newServiceClient(cfg.service), func() {}, nil
	}
	pool, err := pgxpool.New(ctx, cfg.postgres)
	if err != nil {
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	var h http.Handler
	var closeOwner func() error
	if cfg.inbox != "" {
		in, err := inbox.New(pool, cfg.inbox, inbox.WithTable(or(cfg.table, inbox.DefaultTable)))
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		h, closeOwner = inbox.ParkedHandler(in, nil), in.Close
	} else {
		// The parked calls do no Kafka I/O: the brokers and topics are
		// placeholders New requires.
		pc, err := partition.New(pool, []string{"unused.invalid:9092"}, cfg.group, []string{"unused"},
			partition.WithTable(or(cfg.table, partition.DefaultTable)))
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		h, closeOwner = partition.ParkedHandler(pc, nil), pc.Close
	}
	return newLocalClient(h), func() { _ = closeOwner(); pool.Close() }, nil // Close waits for a commit in flight
}

func or(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

// runParked runs cfg's verb through c and prints its outcome.
func runParked(ctx context.Context, cfg parkedConfig, c *parkedClient, w io.Writer) error {
	var out any
	switch {
	case cfg.verb == "list":
		ms, err := listAllParked(ctx, c, cfg.topic, cfg.partition)
		if err != nil {
			return err
		}
		if !cfg.json {
			printParked(w, ms)
			return nil
		}
		out = ms
	case cfg.verb == "replay":
		var r parkedhttp.Replayed
		if err := c.call(ctx, "replay", url.Values{"id": {cfg.id.String()}}, &r); err != nil {
			return err
		}
		out = r
	case cfg.hasID:
		var r parkedhttp.Purged
		if err := c.call(ctx, "purge", url.Values{"id": {cfg.id.String()}}, &r); err != nil {
			return err
		}
		out = r
	default:
		var r parkedhttp.Purged
		if err := c.call(ctx, "purge", url.Values{"older_than": {cfg.olderThan.String()}}, &r); err != nil {
			return err
		}
		out = r
	}
	if cfg.json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	switch r := out.(type) {
	case parkedhttp.Replayed:
		fmt.Fprintf(w, "replayed %s\n", r.Replayed)
	case parkedhttp.Purged:
		fmt.Fprintf(w, "purged %d\n", r.Purged)
	}
	return nil
}

// listAllParked pages through every parked message, keeping topic's (all:
// "") and partition's (all: -1).
func listAllParked(ctx context.Context, c *parkedClient, topic string, partition int) ([]parkedhttp.Message, error) {
	all := []parkedhttp.Message{}
	after := ""
	for {
		q := url.Values{"limit": {strconv.Itoa(parkedhttp.MaxLimit)}}
		if after != "" {
			q.Set("after", after)
		}
		var p parkedhttp.Page
		if err := c.call(ctx, "", q, &p); err != nil {
			return nil, err
		}
		for _, m := range p.Messages {
			if (topic == "" || m.Topic == topic) && (partition < 0 || m.Partition == partition) {
				all = append(all, m)
			}
		}
		if p.Next == "" {
			return all, nil
		}
		after = p.Next
	}
}

// printParked prints one line per message, its value's preview cut to
// fit.
func printParked(w io.Writer, ms []parkedhttp.Message) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPARKED AT\tATTEMPTS\tKEY\tVALUE\tERROR")
	for _, m := range ms {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", m.ID, m.ParkedAt.UTC().Format(time.RFC3339), m.Attempts,
			cut(strconv.Quote(m.Key), 40), cut(strconv.Quote(m.Value), 60)+fmt.Sprintf(" (%d bytes)", m.ValueSize), cut(m.Error, 80))
	}
	tw.Flush()
	fmt.Fprintf(w, "%d parked\n", len(ms))
}

// cut shortens s to n runes, marking the cut with "…".
func cut(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
