package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// EnvDynalite names the dynalite launcher and module directory that
// scripts/services installed, for DynamoDBServer.
const EnvDynalite = "NOLOCK_TEST_DYNALITE"

// DDBServer is a DynamoDB-API server (dynalite) of the test's own, for
// fault tests that kill and restart the server: doing that to the shared
// one would break every other test running. It keeps its tables on disk,
// so what it acknowledged survives a kill, listens on a free loopback port
// that stays the same across restarts, and is killed when the test ends.
type DDBServer struct {
	t        testing.TB
	argv     []string
	dir      string
	port     int
	cmd      *exec.Cmd
	exited   chan struct{}
	endpoint string
}

// DynamoDBServer starts a DDBServer.
func DynamoDBServer(t testing.TB) *DDBServer {
	t.Helper()
	launcher, moduleDir, ok := strings.Cut(need(t, EnvDynalite), " ")
	if !ok {
		t.Fatalf("testenv: %s=%q: want the launcher and the module directory", EnvDynalite, os.Getenv(EnvDynalite))
	}
	s := &DDBServer{t: t, dir: t.TempDir(), port: freePort(t)} // free again when it restarts
	s.endpoint = fmt.Sprintf("http://127.0.0.1:%d", s.port)
	s.argv = []string{launcher, moduleDir, "--host", "127.0.0.1", "--port", strconv.Itoa(s.port),
		"--path", s.dir, "--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"}
	s.Start()
	t.Cleanup(s.Kill)
	return s
}

// Endpoint returns the server's endpoint URL.
func (s *DDBServer) Endpoint() string { return s.endpoint }

// Client returns a client of the server whose idle connections are closed
// when the test ends.
func (s *DDBServer) Client() *dynamodb.Client { return dynamoDBClient(s.t, s.endpoint) }

// Kill ends the server with SIGKILL, as a crash would: requests in flight
// get no answer and connections break. It returns once the process is gone.
func (s *DDBServer) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// KillFor kills the server, keeps it down for d, and starts it again.
func (s *DDBServer) KillFor(d time.Duration) {
	s.Kill()
	time.Sleep(d)
	s.Start()
}

// Start starts the server on its port and waits until it accepts
// connections.
func (s *DDBServer) Start() {
	s.t.Helper()
	unhold(s.port)
	cmd := exec.Command("node", s.argv...)
	cmd.Stderr = testWriter{s.t}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("testenv: start dynalite: %v", err)
	}
	prioritise(cmd.Process.Pid)
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	Until(s.t, "dynalite accepts connections", func() (bool, error) {
		select {
		case <-exited:
			return false, fmt.Errorf("dynalite exited during start")
		default:
		}
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", s.port))
		if err != nil {
			return false, nil
		}
		c.Close()
		return true, nil
	})
}
