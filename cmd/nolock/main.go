// Command nolock runs nolock's narrated demo on real services, measures
// the patterns against lock-based baselines on your own database, and
// prints the tables the packages need.
//
//	nolock demo    [-postgres DSN] [-kafka BROKERS] [-dynamodb URL] [-run REGEXP] [-metrics ADDR]
//	nolock bench   [-postgres DSN] [-redis ADDR] [-clients 1,4,16,64] [-duration 3s] [-svg FILE] [-run REGEXP] [-from FILE] [-metrics ADDR]
//	nolock schema  [-partitioned] [postgres | dynamodb]
//	nolock doctor  [-postgres DSN] [-kafka BROKERS -topic TOPICS] [-dynamodb URL -dynamodb-table TABLES] [-service URL] [-json]
//	nolock parked  list|replay|purge [-inbox NAME | -group GROUP] [-postgres DSN | -service URL] [-json] [ID]
//	nolock version
//	nolock help    [command]
//
// -postgres defaults to $DATABASE_URL and, when that is empty too, to the
// libpq environment variables (PGHOST, PGPORT, PGUSER, PGPASSWORD,
// PGDATABASE, PGSSLMODE, ...) as pgx reads them. -dynamodb defaults to
// $AWS_ENDPOINT_URL_DYNAMODB, then $AWS_ENDPOINT_URL. -kafka has no
// default.
//
// Exit status: 0 on success (and for -h and help), 1 when a command fails
// (for the demo: when an invariant it checks breaks), 2 on a usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"text/tabwriter"
)

func main() {
	ctx, stop := signalContext()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// signalContext is cancelled by Ctrl-C (SIGINT) or SIGTERM: a command then
// stops and removes what it created before it exits.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// command is one subcommand. flags defines its flags on fs and returns the
// function that runs it once fs has parsed the arguments; that function
// returns the exit status.
type command struct {
	name, args, summary, about string
	flags                      func(fs *flag.FlagSet, stdout, stderr io.Writer) func(ctx context.Context) int
}

var commands = []command{
	{
		name: "demo", args: "[-postgres DSN] [-kafka BROKERS] [-dynamodb URL] [-run REGEXP] [-metrics ADDR]",
		summary: "run the narrated cases on PostgreSQL, Kafka and a DynamoDB-API server",
		about: `Runs the cases of the background article on the real services, one after
another, in a fresh PostgreSQL schema, Kafka topics and DynamoDB tables
that it creates and drops: a paused lock holder, a flash sale, a wallet
with retried payments, a nightly cron on six replicas, a leader-only job
on PostgreSQL, a crashing Kafka worker and a paused partition owner. It
prints a transcript and a table of what each case measured, and exits 1
if an invariant broke. -run picks scenes by name; a scene whose service
(-kafka, -dynamodb) is not given is skipped with a line that says so.
Ctrl-C or SIGTERM stops it and drops what it created. The DynamoDB
endpoint is a local server (the demo signs with fixed test credentials).
scripts/demo starts local services and runs this with them.`,
		flags: demoCommand,
	},
	{
		name: "bench", args: "[-postgres DSN] [-redis ADDR] [-clients 1,4,16,64] [-duration 3s] [-svg FILE] [-run REGEXP] [-from FILE] [-metrics ADDR]",
		summary: "measure the patterns against lock-based baselines on your database",
		about: `Runs every strategy for "take one unit of one hot key" side by side, each
for -duration at each client count, in a fresh schema it creates and
drops, and prints ops/s with the ratio to a SELECT … FOR UPDATE
transaction at the same count. It fails if the store shows other effects
than the operations that succeeded. With -svg it also writes a plot; with
-run only the baseline and the scenarios it names run. With -from it
measures nothing: it reads a package's go test -bench output (from
scripts/bench or go test) and prints and plots its rates by client count.`,
		flags: benchCommand,
	},
	{
		name: "schema", args: "[-partitioned] [postgres | dynamodb]",
		summary: "print the tables every package needs",
		about: `Prints every PostgreSQL table of every package (idempotent DDL with the
default names, ready for psql or a migration tool), then the DynamoDB
tables as 'aws dynamodb create-table --cli-input-json' commands, one per
DynamoDB-backed type, commented out so that the whole output stays SQL.
"nolock schema postgres" prints only the DDL; "nolock schema dynamodb"
prints only the DynamoDB commands, as a shell script. With -partitioned,
the idempotency records and inbox ids tables come first partitioned by
day of their UUIDv7 keys, with nolock_create_partitions to create the
days (retention by dropping a day: docs/operating.md). Nothing connects
anywhere.`,
		flags: schemaCommand,
	},
	{
		name: "doctor", args: "[-postgres DSN] [-kafka BROKERS -topic TOPICS] [-dynamodb URL -dynamodb-table TABLES] [-service URL] [-json]",
		summary: "check that a deployment is set up the way the patterns need",
		about: `Connects to each service given, as your services do, and prints one line per
check, pass, warn or fail, with the fix: the PostgreSQL server (a
standby, an old release), the pooler in front of it and the pgx mode to
use there (default_query_exec_mode in the DSN), durability
(fsync, synchronous_commit, synchronous standbys), the default isolation
level and nolock's tables on the search_path with their sizes; Kafka's
brokers and each -topic's partitions, replication and
min.insync.replicas; the DynamoDB endpoint and each -dynamodb-table's key
schema and time to live; for each -service (the URL where a service mounts
inbox.ParkedHandler or partition.ParkedHandler, as nolock parked takes it)
the isolation level its consumer reads Kafka with and whether it runs.
It changes nothing. Exit status 1 when a check fails.`,
		flags: doctorCommand,
	},
	{
		name: "parked", args: "list|replay|purge [-inbox NAME | -group GROUP] [-table NAME] [-postgres DSN | -service URL] [-topic T] [-partition N] [-older-than DURATION] [-json] [ID]",
		summary: "list, replay or purge the parked messages of an inbox or a partition consumer",
		about: `Lists, replays or purges the messages an inbox (-inbox NAME, its consumer
name) or a partition consumer (-group GROUP) parked. list pages through
every one (-topic and -partition keep some): its ID (topic/partition@offset),
when it was parked, its attempts, the first 256 bytes of its key and of its
value, and the last error. purge deletes one ID, or with -older-than every one
parked longer ago than that, without applying it.

list and purge read the table directly (-postgres, through the package's
own calls) or ask your service (-service). replay runs your handler, in the
same transaction as ReplayParked, so it needs your service: mount
inbox.ParkedHandler or partition.ParkedHandler there (behind your own
authentication) and give its URL as -service. A replay applies a message
at most once: a second replay of the same ID reports "not parked".
Exit status 1 when the call fails (an ID not parked included), 2 on a bad
ID or flag, before anything connects. See docs/operating.md.`,
		flags: parkedCommand,
	},
	{
		name: "version", summary: "print the module version",
		about: `Prints the version of the nolock module this binary was built from and
the Go version that built it. A binary built from a source checkout
without version information reports "(devel)".`,
		flags: func(fs *flag.FlagSet, stdout, _ io.Writer) func(context.Context) int {
			return func(context.Context) int {
				if fs.NArg() > 0 {
					return usageError(fs, "nolock version takes no arguments")
				}
				fmt.Fprintln(stdout, versionString())
				return 0
			}
		},
	},
}

// envHelp describes where the connection flags find their defaults.
const envHelp = `Connection defaults, when a flag is not given:
  -postgres  $DATABASE_URL, else the libpq variables (PGHOST, PGPORT, PGUSER,
             PGPASSWORD, PGDATABASE, PGSSLMODE, ...) as pgx reads them
  -dynamodb  $AWS_ENDPOINT_URL_DYNAMODB, else $AWS_ENDPOINT_URL
  -kafka     none`

// run is the command line: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printUsage(stderr)
		return 2
	}
	switch name := args[0]; name {
	case "-h", "-help", "--help", "help":
		if name == "help" && len(args) > 1 {
			c, ok := lookup(args[1])
			if !ok || len(args) > 2 {
				fmt.Fprintf(stderr, "nolock help: unknown command %q\n\n", strings.Join(args[1:], " "))
				printUsage(stderr)
				return 2
			}
			printCommandUsage(stdout, c, newFlagSet(c, stdout, stderr))
			return 0
		}
		printUsage(stdout)
		return 0
	default:
		c, ok := lookup(name)
		if !ok {
			fmt.Fprintf(stderr, "nolock: unknown command %q\n\n", name)
			printUsage(stderr)
			return 2
		}
		fs := flag.NewFlagSet("nolock "+c.name, flag.ContinueOnError)
		fs.SetOutput(stderr)
		fs.Usage = func() {} // printed below, to stdout for -h and stderr otherwise
		runCmd := c.flags(fs, stdout, stderr)
		if err := fs.Parse(args[1:]); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printCommandUsage(stdout, c, fs)
				return 0
			}
			fmt.Fprintln(stderr)
			printCommandUsage(stderr, c, fs)
			return 2
		}
		return runCmd(ctx)
	}
}

func lookup(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// newFlagSet returns c's flags, defined and not parsed, for its usage text.
func newFlagSet(c command, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("nolock "+c.name, flag.ContinueOnError)
	c.flags(fs, stdout, stderr)
	return fs
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "nolock: coordination patterns that replace distributed locks, run on your own services.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "usage:")
	for _, c := range commands {
		fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("  nolock %-8s %s", c.name, c.args), " "))
	}
	fmt.Fprintf(w, "  nolock %-8s %s\n", "help", "[command]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	fmt.Fprintf(tw, "  help\t%s\n", "print this, or a command's flags")
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, envHelp)
	fmt.Fprintln(w)
	fmt.Fprintln(w, `"nolock <command> -h" describes a command and its flags.`)
}

func printCommandUsage(w io.Writer, c command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: nolock %s %s\n\n%s\n", c.name, c.args, c.about)
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		fmt.Fprintln(w, "\nflags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
}

// usageError reports a usage error found after parsing: exit status 2.
func usageError(fs *flag.FlagSet, msg string) int {
	fmt.Fprintf(fs.Output(), "%s (see %s -h)\n", msg, fs.Name())
	return 2
}

// versionString is "nolock <module version> <go version>"; the module
// version is "(devel)" when the binary carries none.
func versionString() string {
	v, goVersion := "(devel)", runtime.Version()
	if info, ok := debug.ReadBuildInfo(); ok {
		if info.Main.Version != "" {
			v = info.Main.Version
		}
		if info.GoVersion != "" {
			goVersion = info.GoVersion
		}
	}
	return fmt.Sprintf("nolock %s %s", v, goVersion)
}
