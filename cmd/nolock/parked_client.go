package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"

	"github.com/nolock/nolock/internal/parkedhttp"
)

// parkedClient speaks parkedhttp's protocol: to a service over HTTP, or to
// a handler in this process (the packages' own calls on the table), so
// that both paths print the same.
type parkedClient struct {
	base string // the handler's URL
	hc   *http.Client
}

func newServiceClient(base string) *parkedClient {
	return &parkedClient{base: base, hc: &http.Client{}}
}

// newLocalClient serves h in this process, without a socket.
func newLocalClient(h http.Handler) *parkedClient {
	rt := roundTripper(func(r *http.Request) (*http.Response, error) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Result(), nil
	})
	return &parkedClient{base: "http://local/", hc: &http.Client{Transport: rt}}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// serviceError is the service's answer to a failed call.
type serviceError struct {
	status int
	answer parkedhttp.Error
}

func (e *serviceError) Error() string {
	if e.answer.Code == parkedhttp.CodeNotParked {
		return "not parked (replayed or purged already, or never parked): " + e.answer.Error
	}
	return fmt.Sprintf("%s (HTTP %d, %s)", e.answer.Error, e.status, e.answer.Code)
}

// call makes op ("" to list, replay, purge, consumer) with q and decodes
// the answer into out.
func (c *parkedClient) call(ctx context.Context, op string, q url.Values, out any) error {
	u, err := url.Parse(c.base)
	if err != nil {
		return err
	}
	method := http.MethodGet
	switch op {
	case "":
		if !strings.HasSuffix(u.Path, "/") {
			u.Path += "/"
		}
	case "consumer":
		u = u.JoinPath(op)
	default:
		method = http.MethodPost
		u = u.JoinPath(op)
	}
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s: reading the answer: %w", u.Redacted(), err)
	}
	if resp.StatusCode != http.StatusOK {
		e := &serviceError{status: resp.StatusCode}
		if json.Unmarshal(body, &e.answer) != nil || e.answer.Code == "" {
			return fmt.Errorf("%s: HTTP %d: %.200s", u.Redacted(), resp.StatusCode, body)
		}
		return e
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%s: the answer is not the parked protocol's: %w", u.Redacted(), err)
	}
	return nil
}
