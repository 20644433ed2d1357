package resendhook_test

import (
	"bufio"
	"crypto/rand"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// twoMiBMail registers a mail with two 1 MiB attachments under a new email
// id and returns its email.received event.
func twoMiBMail(b *testing.B, h *harness, n int64, contents [2][]byte) (id string, body []byte) {
	id = "bench-" + strconv.FormatInt(n, 10)
	h.api.addEmail(b, id, func(e map[string]any) {
		e["text"], e["message_id"] = "bench "+id, "<"+id+"@mail.example.com>"
	},
		fakeAttachment{ID: id + "-1", Filename: "photo-1.jpg", ContentType: "image/jpeg", ContentDisposition: "attachment", Content: contents[0]},
		fakeAttachment{ID: id + "-2", Filename: "photo-2.jpg", ContentType: "image/jpeg", ContentDisposition: "attachment", Content: contents[1]},
	)
	return id, receivedEvent(b, id, nil)
}

func attachmentContents() [2][]byte {
	var c [2][]byte
	for i := range c {
		c[i] = make([]byte, 1<<20)
		rand.Read(c[i])
	}
	return c
}

// BenchmarkMailTwoAttachments is one inbound mail with two 1 MiB
// attachments, through the whole handler: verify, claim, fetch the email,
// list its attachments, download both into the message's transaction,
// commit, confirm. The Resend API and its CDN are the local fake; Postgres
// and Redis are the real test servers.
func BenchmarkMailTwoAttachments(b *testing.B) {
	h := newHarness(b, options{quiet: true})
	contents := attachmentContents()
	var n int64
	b.ReportAllocs()
	for b.Loop() {
		n++
		id, body := twoMiBMail(b, h, n, contents)
		if w := h.deliver(b, "msg_"+id, body); w.Code != 200 {
			b.Fatalf("delivery %s: %d %s", id, w.Code, w.Body)
		}
	}
}

// BenchmarkMailTwoAttachmentsInFlight keeps 8 such mails in flight at once
// (at least 8 goroutines; the pool has the service's 16 connections) and reports the process's peak RSS (VmHWM): the handler's,
// plus the fake API's, which holds the two contents once.
func BenchmarkMailTwoAttachmentsInFlight(b *testing.B) {
	h := newHarness(b, options{quiet: true, poolSize: 16})
	contents := attachmentContents()
	var n atomic.Int64
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((8 + procs - 1) / procs) // RunParallel starts parallelism x GOMAXPROCS goroutines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id, body := twoMiBMail(b, h, n.Add(1), contents)
			if w := h.deliver(b, "msg_"+id, body); w.Code != 200 {
				b.Errorf("delivery %s: %d %s", id, w.Code, w.Body)
			}
		}
	})
	b.StopTimer()
	if hwm, ok := peakRSS(); ok {
		b.ReportMetric(float64(hwm)/(1<<20), "peak-RSS-MiB")
	}
}

// peakRSS reads VmHWM from /proc/self/status (Linux), in bytes.
func peakRSS() (int64, bool) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}
