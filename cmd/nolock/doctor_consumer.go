package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"strings"

	"github.com/nolock/nolock/internal/parkedhttp"
)

// serviceFlag defines doctor's -service: repeatable, each comma-separated,
// every URL checked as `nolock parked -service` takes it.
func serviceFlag(fs *flag.FlagSet, p *[]string) {
	fs.Func("service", "`URL` where a service mounts inbox.ParkedHandler or partition.ParkedHandler, to check\nits consumer's isolation level (repeatable, or comma-separated)", func(s string) error {
		for _, v := range strings.Split(s, ",") {
			if v = strings.TrimSpace(v); v == "" {
				continue
			}
			if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("%q is not an http:// or https:// URL", v)
			}
			*p = append(*p, v)
		}
		return nil
	})
}

// The fixes of the consumer findings.
const (
	fixUnreachable = "check -service (the URL where the service mounts inbox.ParkedHandler or partition.ParkedHandler, " +
		"credentials in it if the service asks for them) and that the service is up"
	fixInboxUncommitted = "set ReaderConfig.IsolationLevel: kafka.ReadCommitted; nolock applies committed data only either way " +
		"but waits for open transactions and fetches each range twice"
	fixPartitionUncommitted = "drop WithReadUncommitted(true); nolock applies committed data only either way " +
		"but waits for open transactions"
	fixUnknown = "give Run a *kafka.Reader (with IsolationLevel: kafka.ReadCommitted): Run tells aborted transactions " +
		"and control records only from a Reader with Config()"
	fixNotRunning = "start Run, or read the service's log for why it returned"
	fixOld        = "upgrade nolock in the service: its handler does not describe its consumer"
)

// checkConsumer asks the service at base how its consumer reads: a pass
// for read committed while Run runs, a warn for read uncommitted, an
// unknown level or Run not running, a fail when the service does not
// answer.
func checkConsumer(ctx context.Context, base string) finding {
	shown := base
	if u, err := url.Parse(base); err == nil {
		shown = u.Redacted()
	}
	var c parkedhttp.Consumer
	if err := newServiceClient(base).call(ctx, "consumer", nil, &c); err != nil {
		return finding{Area: "consumer", Status: fail, Detail: fmt.Sprintf("service %s: %v", shown, err), Fix: fixUnreachable}
	}
	if c.Kind == "" {
		return finding{Area: "consumer", Status: warn, Detail: fmt.Sprintf("service %s: isolation level unknown", shown), Fix: fixOld}
	}
	return consumerFinding(shown, c)
}

// consumerFinding judges c, as the service at shown described it.
func consumerFinding(shown string, c parkedhttp.Consumer) finding {
	f := finding{Area: "consumer", Status: pass}
	who := fmt.Sprintf("service %s: %s %q", shown, c.Kind, c.Name)
	if c.Group != "" && c.Group != c.Name {
		who += fmt.Sprintf(" (group %s)", c.Group)
	}
	if len(c.Topics) > 0 {
		who += fmt.Sprintf(" on %s", strings.Join(c.Topics, ","))
	}
	state := fmt.Sprintf("running, %d partition(s)", c.Partitions)
	if !c.Running {
		state = "not running"
	}
	f.Detail = fmt.Sprintf("%s reads %s, %s", who, c.IsolationLevel, state)
	var fixes []string
	switch c.IsolationLevel {
	case parkedhttp.ReadCommitted:
	case parkedhttp.ReadUncommitted:
		if c.Kind == parkedhttp.KindPartition {
			fixes = append(fixes, fixPartitionUncommitted)
		} else {
			fixes = append(fixes, fixInboxUncommitted)
		}
	default: // unknown: a Reader without Config, or no Run yet
		if c.Running {
			fixes = append(fixes, fixUnknown)
		}
	}
	if !c.Running {
		fixes = append(fixes, fixNotRunning)
	}
	if len(fixes) > 0 {
		f.Status, f.Fix = warn, strings.Join(fixes, "; ")
	}
	return f
}
