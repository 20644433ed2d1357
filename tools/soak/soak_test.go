package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestSoakShort runs a short soak (2,500 events, chaos every ~3 s per
// component, about a minute) and fails unless the database matches the
// model: nothing lost, regressed or duplicated. `make soak` runs the long
// one.
func TestSoakShort(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: about a minute of chaos; not in -short")
	}
	var out lineLogger
	out.t = t
	err := run(context.Background(), []string{
		"-events", "2500", "-subs", "50", "-rate", "60", "-chaos", "3s", "-timeout", "4m",
	}, &out, &out)
	out.Flush()
	if err != nil {
		t.Fatal(err)
	}
}

// lineLogger passes whole lines to t.Log.
type lineLogger struct {
	t   *testing.T
	buf bytes.Buffer
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.buf.Write(p)
	for {
		line, err := l.buf.ReadString('\n')
		if err != nil {
			l.buf.WriteString(line)
			return len(p), nil
		}
		l.t.Log(strings.TrimRight(line, "\n"))
	}
}

func (l *lineLogger) Flush() {
	if l.buf.Len() > 0 {
		l.t.Log(l.buf.String())
		l.buf.Reset()
	}
}
