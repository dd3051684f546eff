package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The Prometheus test server (scripts/services env prints them): its HTTP
// API, and the folder of scrape-target files it re-reads every second.
const (
	EnvPrometheus        = "NOLOCK_TEST_PROMETHEUS"
	EnvPrometheusTargets = "NOLOCK_TEST_PROMETHEUS_TARGETS"
)

// PromServer is the Prometheus test server, scraping what a test names.
type PromServer struct {
	t   testing.TB
	api string
	job string // the label that tells this test's samples from others'
}

// Prometheus returns the test server, failing or skipping like every
// service when it is not set up.
func Prometheus(t testing.TB) *PromServer {
	t.Helper()
	return &PromServer{t: t, api: need(t, EnvPrometheus), job: Name("p")}
}

// Scrape has the server scrape http://addr/metrics every second, its
// samples labelled instance_of=<this test's label> (see Label), until the
// test ends.
func (p *PromServer) Scrape(addr string) {
	p.t.Helper()
	dir := need(p.t, EnvPrometheusTargets)
	file := filepath.Join(dir, p.job+".json")
	body, err := json.Marshal([]map[string]any{{"targets": []string{addr}, "labels": map[string]string{"instance_of": p.job}}})
	if err != nil {
		p.t.Fatal(err)
	}
	// Written whole, then renamed: the server never reads half a file.
	if err := os.WriteFile(file+".tmp", body, 0o644); err != nil {
		p.t.Fatalf("testenv: prometheus target: %v", err)
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		p.t.Fatalf("testenv: prometheus target: %v", err)
	}
	p.t.Cleanup(func() { _ = os.Remove(file) })
}

// Label is the instance_of label value of this test's scraped samples.
func (p *PromServer) Label() string { return p.job }

// PromSeries is one series of an instant query's answer.
type PromSeries struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"` // [unix time, "value"]
}

// Query runs an instant PromQL query and returns its series; a query the
// server refuses fails the test.
func (p *PromServer) Query(query string) []PromSeries {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.api+"/api/v1/query?query="+url.QueryEscape(query), nil)
	if err != nil {
		p.t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatalf("testenv: prometheus query %q: %v", query, err)
	}
	defer res.Body.Close()
	var answer struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string       `json:"resultType"`
			Result     []PromSeries `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(res.Body).Decode(&answer); err != nil {
		p.t.Fatalf("testenv: prometheus query %q: %v", query, err)
	}
	if answer.Status != "success" {
		p.t.Fatalf("testenv: prometheus refused %q: %s", query, answer.Error)
	}
	return answer.Data.Result
}

// WaitSeries polls query until it returns at least one series and returns
// them; it fails the test if none came within a minute (scrapes run every
// second).
func (p *PromServer) WaitSeries(query string) []PromSeries {
	p.t.Helper()
	var got []PromSeries
	Until(p.t, fmt.Sprintf("prometheus series for %s", query), func() (bool, error) {
		got = p.Query(query)
		return len(got) > 0, nil
	})
	return got
}
