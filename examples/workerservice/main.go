// Command workerservice is a Kafka worker that applies payments to
// PostgreSQL exactly once with the transactional inbox: each message's id
// and its effect (a ledger row and the account's balance) commit in one
// transaction, and its Kafka offset is committed after, so a redelivery or
// a producer's resend is skipped. A message that keeps failing is parked,
// its partition moves on, and an operator replays or purges it later.
//
// Messages: key = account, value = amount (an integer), header "id" = the
// payment's id, set by the producer. A value that is not an integer is
// parked at once (inbox.Permanent).
//
// Environment:
//
//	DATABASE_URL      PostgreSQL (required); the tables are created at start
//	KAFKA_BROKERS     comma-separated brokers (required)
//	KAFKA_TOPIC       the payments topic (required)
//	KAFKA_GROUP       consumer group and inbox consumer name (default payments-ledger)
//	INBOX_RETENTION   how long processed ids are kept: at least the topic's retention (default 168h)
//	PARKED_RETENTION  how long parked messages wait for an operator (default 336h)
//	REAP_INTERVAL     how often both are reaped (default 1m)
//	ADMIN_TOKEN       when set, /admin/parked/ (inbox.ParkedHandler: list, replay,
//	                  purge, and the consumer's description for nolock doctor)
//	                  answers requests that carry it, as a bearer token or as
//	                  the basic-authentication password
//	ADDR              listen address for /healthz, /metrics, /accounts (default :8080)
//
// On SIGTERM the batches in flight commit (or roll back whole), their
// offsets are committed, and the reader leaves the group.
//
// Try it:
//
//	DATABASE_URL=postgres://postgres@localhost:5432/postgres KAFKA_BROKERS=localhost:9092 KAFKA_TOPIC=payments go run ./examples/workerservice
//	kcat -P -b localhost:9092 -t payments -k acct-1 -H id=pay-1 <<< 250   # twice: applied once
//	curl localhost:8080/accounts/acct-1
//	curl -H "Authorization: Bearer $ADMIN_TOKEN" localhost:8080/admin/parked/   # started with ADMIN_TOKEN set
//	nolock parked list -service "http://admin:$ADMIN_TOKEN@localhost:8080/admin/parked/"
//	nolock doctor -service "http://admin:$ADMIN_TOKEN@localhost:8080/admin/parked/"   # read_committed, running
package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/examples/internal/pgservice"
	"github.com/nolock/nolock/examples/internal/service"
	"github.com/nolock/nolock/inbox"
)

const schema = `
CREATE TABLE IF NOT EXISTS ledger (payment text PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL, at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS balances (account text PRIMARY KEY, balance bigint NOT NULL)`

func main() {
	s := service.New("workerservice")
	s.Require("DATABASE_URL", "KAFKA_BROKERS", "KAFKA_TOPIC")
	brokers, topic := s.Brokers(), s.Env("KAFKA_TOPIC", "")
	group := s.Env("KAFKA_GROUP", "payments-ledger")
	retention := s.Duration("INBOX_RETENTION", 7*24*time.Hour)
	parkedRetention := s.Duration("PARKED_RETENTION", 14*24*time.Hour)
	pool := pgservice.Pool(s)
	in, err := inbox.New(pool, group, inbox.WithObserver(s.Observer()), inbox.WithLogger(s.Log))
	if err != nil {
		s.Fatal(err)
	}
	s.OnStop(in.Close)
	if err := in.CreateSchema(s.Context()); err != nil {
		s.Fatal(err)
	}
	if _, err := pool.Exec(s.Context(), schema); err != nil {
		s.Fatal(err)
	}
	s.Reap("inbox", func(ctx context.Context) (int64, error) { return in.Reap(ctx, retention, 1000) })
	s.Reap("parked", func(ctx context.Context) (int64, error) { return in.PurgeParkedOlderThan(ctx, parkedRetention, 1000) })

	tr := &kafka.Transport{}
	s.OnStop(func() error { tr.CloseIdleConnections(); return nil })
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, GroupID: group,
		StartOffset: kafka.FirstOffset, IsolationLevel: kafka.ReadCommitted, MaxWait: 250 * time.Millisecond})
	s.OnStop(r.Close) // after Run returned: the reader leaves the group
	kc := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr}
	s.Check("kafka", func(ctx context.Context) error {
		_, err := kc.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		return err
	})
	s.Go("consumer", func(ctx context.Context) error { return in.Run(ctx, r, apply) })

	s.HandleFunc("GET /accounts/{account}", func(w http.ResponseWriter, r *http.Request) {
		var balance int64
		err := pool.QueryRow(r.Context(), `SELECT balance FROM balances WHERE account = $1`, r.PathValue("account")).Scan(&balance)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			service.Error(w, http.StatusNotFound, "no payment for this account yet")
		case err != nil:
			service.Error(w, http.StatusInternalServerError, err.Error())
		default:
			service.JSON(w, http.StatusOK, map[string]any{"account": r.PathValue("account"), "balance": balance})
		}
	})
	if token := s.Env("ADMIN_TOKEN", ""); token != "" {
		s.Handle("/admin/parked/", admin(token, inbox.ParkedHandler(in, apply)))
	}
	s.Run()
}

// apply is the inbox's handler: the payment's ledger row and the account's
// balance, in the transaction that records the message's id.
func apply(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
	amount, err := strconv.ParseInt(string(m.Value), 10, 64)
	if err != nil {
		return inbox.Permanent(fmt.Errorf("amount %q: %w", m.Value, err))
	}
	var payment string
	for _, h := range m.Headers {
		if h.Key == "id" {
			payment = string(h.Value)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO ledger (payment, account, amount) VALUES ($1, $2, $3)`, payment, string(m.Key), amount); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO balances VALUES ($1, $2) ON CONFLICT (account) DO UPDATE SET balance = balances.balance + $2`, string(m.Key), amount)
	return err
}

// admin lets through requests that carry the token: as a bearer token,
// or as the password of basic authentication, which a URL's userinfo
// gives (nolock parked -service http://admin:TOKEN@host/admin/parked/).
func admin(token string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			_, got, _ = r.BasicAuth()
		}
		if subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="admin"`)
			service.Error(w, http.StatusUnauthorized, "admin: token required")
			return
		}
		h.ServeHTTP(w, r)
	})
}
