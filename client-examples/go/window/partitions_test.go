package window

import (
	"context"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

// partitionedReads is a fake sidecar's script (see start) that opens the subscription with
// Opened.partitions set to shared, sends a read of partition 3 (slots 1 and 2), then a read
// without a partition, as an unpartitioned stream's (slot 3, whose entry id 5-0 the first read
// has too), and serves until the client half-closes.
func partitionedReads(shared uint32) func(*testing.T, windowv1.WindowService_SubscribeServer) error {
	return func(t *testing.T, s windowv1.WindowService_SubscribeServer) error {
		o := opened()
		o.GetOpened().Partitions = shared
		s.Send(o)
		three := uint32(3)
		r := read(1, 1, "5-0", "6-0")
		r.GetRead().Partition = &three
		s.Send(r)
		s.Send(read(2, 3, "5-0"))
		for {
			if _, err := s.Recv(); err != nil {
				return nil
			}
		}
	}
}

// partitionSeen is what a test saw of a delivery's or a batch's partition.
type partitionSeen struct {
	id        uint64 // a delivery's slot, a batch's read id
	partition uint32
	ok        bool
}

// The subscription's partitions are Opened.partitions, once it is open (a sidecar that leaves
// them 0, as an older one does, reads unpartitioned); each delivery's partition is its read's,
// none for a read without one.
func TestPartitionOfEachDelivery(t *testing.T) {
	for _, shared := range []uint32{4, 0} {
		c, _ := start(t, partitionedReads(shared))
		sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 4, Partitions: 4, Logf: quiet})
		if err != nil {
			t.Fatal(err)
		}
		var seen []partitionSeen
		for i := 0; i < 3; i++ {
			d := recvDelivery(t, sub)
			p, ok := d.Partition()
			seen = append(seen, partitionSeen{d.Slot, p, ok})
			d.Ack()
		}
		if n := sub.Partitions(); n != shared {
			t.Errorf("Opened.partitions %d: Partitions() %d", shared, n)
		}
		sub.Close(context.Background())
		if want := []partitionSeen{{1, 3, true}, {2, 3, true}, {3, 0, false}}; !reflect.DeepEqual(seen, want) {
			t.Errorf("deliveries' partitions %v, want %v", seen, want)
		}
	}
}

// A batch's partition is its read's, as its deliveries' are; none for a read without one.
func TestPartitionOfEachBatch(t *testing.T) {
	c, _ := start(t, partitionedReads(4))
	sub, err := c.Subscribe(context.Background(), Options{Stream: "s", Group: "g", Count: 4, Partitions: 4, Logf: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(context.Background())
	var batches, deliveries []partitionSeen
	for i := 0; i < 2; i++ {
		b := recvBatch(t, sub)
		p, ok := b.Partition()
		batches = append(batches, partitionSeen{b.ReadID, p, ok})
		for _, d := range b.Deliveries {
			p, ok := d.Partition()
			deliveries = append(deliveries, partitionSeen{d.Slot, p, ok})
		}
		b.Ack()
	}
	if want := []partitionSeen{{1, 3, true}, {2, 0, false}}; !reflect.DeepEqual(batches, want) {
		t.Errorf("batches' partitions %v, want %v", batches, want)
	}
	if want := []partitionSeen{{1, 3, true}, {2, 3, true}, {3, 0, false}}; !reflect.DeepEqual(deliveries, want) {
		t.Errorf("their deliveries' partitions %v, want %v", deliveries, want)
	}
	if n := sub.Partitions(); n != 4 {
		t.Errorf("Partitions() %d, want 4", n)
	}
}

// realSidecar starts a throwaway redis-server and a sidecar on it with args (the binary
// WINDOW_SIDECAR_BIN, else the repository's target/debug/window-sidecar), both killed when the
// test ends, and returns the sidecar's address and a redis-cli of that Redis (its reply's lines
// joined by spaces). Without the binary, redis-server or redis-cli the test is skipped: the
// package's other tests need neither.
func realSidecar(t *testing.T, args ...string) (addr string, rcli func(args ...string) string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts redis-server and a sidecar")
	}
	bin := os.Getenv("WINDOW_SIDECAR_BIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "..", "target", "debug", "window-sidecar")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no sidecar binary (%v): set WINDOW_SIDECAR_BIN, or cargo build -p window-sidecar", err)
	}
	for _, tool := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	dir := t.TempDir()
	redisPort := freePort(t)
	run(t, filepath.Join(dir, "redis.log"), "redis-server", "--port", redisPort, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	waitListening(t, "127.0.0.1:"+redisPort)
	addr = "127.0.0.1:" + freePort(t)
	sidecarLog := filepath.Join(dir, "sidecar.log")
	run(t, sidecarLog, bin, append([]string{"--listen", addr, "--redis-url", "redis://127.0.0.1:" + redisPort}, args...)...)
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(sidecarLog); err == nil {
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				if len(lines) > 40 {
					lines = lines[len(lines)-40:]
				}
				t.Logf("the sidecar's last lines:\n%s", strings.Join(lines, "\n"))
			}
		}
	})
	waitListening(t, addr)
	rcli = func(args ...string) string {
		t.Helper()
		out, err := exec.Command("redis-cli", append([]string{"-p", redisPort}, args...)...).Output()
		if err != nil {
			t.Fatalf("redis-cli %v: %v", args, err)
		}
		return strings.Join(strings.Fields(string(out)), " ")
	}
	return addr, rcli
}

// run starts a process logging to logFile; it is killed (by its pid) when the test ends.
func run(t *testing.T, logFile, name string, args ...string) {
	t.Helper()
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		f.Close()
	})
}

func freePort(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return strconv.Itoa(lis.Addr().(*net.TCPAddr).Port)
}

func waitListening(t *testing.T, addr string) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return
		}
	}
	t.Fatalf("nothing listens on %s", addr)
}

// A partitioned stream of 4 partitions, ordered by the header k, read by two subscriptions of
// one group (w1 and w2) of a real sidecar while the client publishes rounds of 20 keys to it by
// k: both subscriptions get some of the partitions, each entry is delivered once and acked
// once, a key's entries are delivered and their side effects applied in publish order, and no
// key ever has two entries out at once, whichever subscription has them.
func TestPartitionedStreamSharedByTwoSubscriptions(t *testing.T) {
	// A short lease: the members renew every third of it, so the second one has its share of
	// the partitions within a second or so rather than several.
	addr, rcli := realSidecar(t, "--consumer-lease", "2s", "--shutdown-grace", "2s")
	const (
		stream     = "orders"
		group      = "g"
		partitions = 4
		keys       = 20
		minRounds  = 8
	)
	c, err := Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	var (
		mu        sync.Mutex
		out       = map[string]string{}          // a key's entry being handled: by which subscription
		handled   = map[string][]int{}           // each key's entries in the order they were handed out
		readers   = map[string]map[string]bool{} // the subscriptions each key's entries went to
		delivered = map[string]int{}             // deliveries of each entry, "key/n"
		acked     = map[string]int{}             // acks of each entry that a flush report confirmed
		per       = map[string]int{}             // deliveries per subscription
		problems  []string
		logs      []string
	)
	note := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	subscribe := func(consumer string) *Subscription {
		sub, err := c.Subscribe(ctx, Options{
			Stream: stream, Group: group, Consumer: consumer, Count: 8,
			OrderingHeader: "k", Partitions: partitions,
			OnFlush: func(f Flush) {
				mu.Lock()
				defer mu.Unlock()
				for _, d := range f.Settled {
					if f.Report.GetOk() && d.Outcome() == windowv1.OutcomeKind_OUTCOME_KIND_ACK {
						acked[string(d.Payload)]++
					}
				}
			},
			OnError: func(err error) { note("%s: %v", consumer, err) },
			Logf: func(format string, args ...any) {
				mu.Lock()
				defer mu.Unlock()
				logs = append(logs, consumer+": "+fmt.Sprintf(format, args...))
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		handler := func(_ context.Context, d *Delivery) error {
			key, n := d.Headers["k"], d.Headers["n"]
			num, _ := strconv.Atoi(n)
			mu.Lock()
			if other, busy := out[key]; busy {
				problems = append(problems, fmt.Sprintf("%s: %s reached %s while an earlier entry of %s was out at %s", key, d.Payload, consumer, key, other))
			}
			if d.DeliveryCount != 1 {
				problems = append(problems, fmt.Sprintf("%s delivered again (count %d) to %s", d.Payload, d.DeliveryCount, consumer))
			}
			out[key] = consumer
			handled[key] = append(handled[key], num)
			if readers[key] == nil {
				readers[key] = map[string]bool{}
			}
			readers[key][consumer] = true
			delivered[string(d.Payload)]++
			per[consumer]++
			mu.Unlock()
			// A little work, so that the partitions are still busy when they are shared out.
			time.Sleep(2 * time.Millisecond)
			if err := d.Queue("RPUSH", "handled:"+key, n); err != nil {
				return err
			}
			// The key is the group's again as soon as this outcome leaves.
			mu.Lock()
			delete(out, key)
			mu.Unlock()
			return d.Ack()
		}
		for i := 0; i < 4; i++ {
			go sub.Run(handler)
		}
		return sub
	}
	subs := []*Subscription{subscribe("w1"), subscribe("w2")}
	defer func() {
		for _, sub := range subs {
			sub.Stop()
		}
		for _, sub := range subs {
			<-sub.Done()
		}
		if t.Failed() {
			mu.Lock()
			defer mu.Unlock()
			t.Logf("the client's log:\n%s", strings.Join(logs, "\n"))
		}
	}()

	// Rounds of one entry per key, until both subscriptions have had some and a few rounds
	// are out: the first member may read every partition before it hands some over, so that a
	// key's rounds go to both.
	rounds := 0
	for deadline := time.Now().Add(30 * time.Second); ; {
		rounds++
		msgs := make([]Message, keys)
		for i := range msgs {
			key := fmt.Sprintf("key-%02d", i)
			msgs[i] = Message{Payload: []byte(fmt.Sprintf("%s/%d", key, rounds)),
				Headers: map[string]string{"k": key, "n": strconv.Itoa(rounds)}}
		}
		if _, err := c.PublishTo(ctx, Target{Stream: stream, Partitions: partitions, PartitionHeader: "k"}, msgs...); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		both := per["w1"] > 0 && per["w2"] > 0
		mu.Unlock()
		if both && rounds >= minRounds || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	total := rounds * keys
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s, %d of %d entries acked", n, total)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	if per["w1"] == 0 || per["w2"] == 0 {
		t.Errorf("the partitions were not shared: deliveries per subscription %v", per)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if len(delivered) != total || len(acked) != total {
		t.Errorf("%d entries published, %d delivered, %d acked", total, len(delivered), len(acked))
	}
	for entry, n := range delivered {
		if n != 1 || acked[entry] != 1 {
			t.Errorf("%s: delivered %d times, acked %d times", entry, n, acked[entry])
		}
	}
	want := make([]string, rounds)
	for i := range want {
		want[i] = strconv.Itoa(i + 1)
	}
	inPartition := make([]int, partitions)
	for i := 0; i < keys; i++ {
		key := fmt.Sprintf("key-%02d", i)
		if got := fmt.Sprint(handled[key]); got != "["+strings.Join(want, " ")+"]" {
			t.Errorf("%s handed out in the order %s", key, got)
		}
		if got := rcli("LRANGE", "handled:"+key, "0", "-1"); got != strings.Join(want, " ") {
			t.Errorf("%s: the side effects applied in the order %s", key, got)
		}
		h := fnv.New32a()
		h.Write([]byte(key))
		inPartition[h.Sum32()%partitions] += rounds
	}
	// Each key's entries in its partition (FNV-1a of the key), nothing in the stream itself, and
	// nothing left pending.
	for p, n := range inPartition {
		part := fmt.Sprintf("%s:{%d}", stream, p)
		if got := rcli("XLEN", part); got != strconv.Itoa(n) {
			t.Errorf("XLEN %s: %s, want %d", part, got, n)
		}
		if got := rcli("XPENDING", part, group); !strings.HasPrefix(got, "0 ") && got != "0" {
			t.Errorf("XPENDING %s %s: %s", part, group, got)
		}
	}
	if got := rcli("EXISTS", stream); got != "0" {
		t.Errorf("EXISTS %s: %s", stream, got)
	}
	moved := 0
	for _, r := range readers {
		if len(r) > 1 {
			moved++
		}
	}
	t.Logf("%d rounds of %d keys; deliveries per subscription %v; %d keys read by both", rounds, keys, per, moved)
}
