package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// pgbenchRun is what pgbench measured in one run, or several.
type pgbenchRun struct {
	tx      float64
	elapsed time.Duration // as pgbench reports its rate: after connecting
	cpu     time.Duration // of pgbench, Postgres and the kernel on their behalf
}

func (r pgbenchRun) tps() float64 { return r.tx / max(r.elapsed.Seconds(), 1e-9) }

func (r pgbenchRun) cpuPerTx() time.Duration { return r.cpu / time.Duration(max(r.tx, 1)) }

// upsertValues are the values pgbench binds for the upsert's parameters, by
// number, as the service binds them for the fixture. $1 and $7, the
// subscription and event ids, are left out: pgbench draws them at random
// per transaction, so that each is a new row; $26 and $27 (the event
// behind the change, and the ledger row's event id) are the event id, as
// on the service's fast path.
func upsertValues() map[int]string {
	v := upsertAfter()
	// The state the fixture says it came from (its previous_attributes:
	// status incomplete), and not a customer.subscription.created.
	v[30] = strings.Replace(v[29], `"status":"active"`, `"status":"incomplete"`, 1)
	v[31] = "false"
	return v
}

// upsertAfter is upsertValues up to the change's after ($29).
func upsertAfter() map[int]string {
	return map[int]string{
		2:  "cus_QmunchableCust01",
		3:  "active",
		4:  "price_1QmunchableMonthly",
		5:  "2025-12-31 12:00:00+00",
		6:  "false",
		8:  "2025-12-01 12:00:00+00",
		9:  "evt_none", // no same-second successor: the fast path
		10: "2026-01-15 12:00:00+00",
		11: "2025-12-01 12:00:00+00",
		12: "2026-01-15 12:00:00+00",
		13: "2025-11-17 12:00:00+00",
		14: "2025-12-01 12:00:00+00",
		15: "void",
		16: "2026-01-15 12:00:00+00",
		17: "false",
		18: "{}",
		19: "{si_QmunchableItem01}",
		20: "{price_1QmunchableMonthly}",
		21: "{prod_QmunchablePlan}",
		22: "{base_monthly}",
		23: "{1}",
		24: "{2025-12-01 12:00:00+00}",
		25: "{2025-12-31 12:00:00+00}",
		28: "customer.subscription.updated", // the ledger row's event type
		// The change's after: the subscription as the feed describes it
		// (entitlements' stateJSON of the values above).
		29: `{"stripe_subscription_id":"sub_bench","stripe_customer_id":"cus_QmunchableCust01",` +
			`"status":"active","price_id":"price_1QmunchableMonthly",` +
			`"current_period_end":"2025-12-31T12:00:00+00:00","cancel_at_period_end":false,` +
			`"cancel_at":null,"canceled_at":null,"ended_at":null,"trial_start":"2025-11-17T12:00:00+00:00",` +
			`"trial_end":"2025-12-01T12:00:00+00:00","pause_collection":"void",` +
			`"access_ends_at":"2026-01-15T12:00:00+00:00","livemode":false,"metadata":{},` +
			`"items":[{"id":"si_QmunchableItem01","price_id":"price_1QmunchableMonthly",` +
			`"product_id":"prod_QmunchablePlan","price_lookup_key":"base_monthly","quantity":1,` +
			`"current_period_start":"2025-12-01T12:00:00+00:00","current_period_end":"2025-12-31T12:00:00+00:00"}]}`,
	}
}

// pgbenchScript is the service's upsert with its $n parameters turned into
// pgbench variables (which pgbench -M prepared sends as parameters again,
// so the server sees the same statement).
func pgbenchScript(sql string) string {
	sql = regexp.MustCompile(`\$([0-9]+)`).ReplaceAllString(strings.TrimSpace(sql), ":p$1")
	return "\\set p1 random(1, 999999999999)\n\\set p7 random(1, 999999999999)\n" +
		"\\set p26 :p7\n\\set p27 :p7\n" + sql + ";\n"
}

// pgbench runs the upsert sql in benchDB for d on o.concurrency
// connections, and adds what it measured to sum.
func (h *harness) pgbench(ctx context.Context, sql string, d time.Duration, sum *pgbenchRun) error {
	script := filepath.Join(h.work, "upsert.pgbench")
	if err := os.WriteFile(script, []byte(pgbenchScript(sql)), 0o644); err != nil {
		return err
	}
	args := []string{h.benchURL, "-n", "-M", "prepared", "-c", strconv.Itoa(h.o.concurrency), "-j", "2",
		"-T", strconv.Itoa(int(d.Seconds())), "-f", script}
	for n, v := range upsertValues() {
		args = append(args, "-D", "p"+strconv.Itoa(n)+"="+v)
	}
	before, err1 := ourCPU(0)
	out, err := exec.CommandContext(ctx, "pgbench", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	after, err2 := ourCPU(0)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	m := regexp.MustCompile(`(?s)actually processed: ([0-9]+)\n.*\ntps = ([0-9.]+) `).FindSubmatch(out)
	if m == nil {
		return fmt.Errorf("pgbench: no transactions in\n%s", out)
	}
	tx, err1 := strconv.ParseFloat(string(m[1]), 64)
	tps, err2 := strconv.ParseFloat(string(m[2]), 64) // after connecting
	if err := errors.Join(err1, err2); err != nil || tps <= 0 {
		return fmt.Errorf("pgbench: %v in\n%s", err, out)
	}
	h.logf("%-37s %6.0f tx/s  cpu %4.0f µs/tx", "pgbench: the upsert", tps, float64(after-before)/tx/1e3)
	sum.tx, sum.elapsed, sum.cpu = sum.tx+tx, sum.elapsed+time.Duration(tx/tps*float64(time.Second)), sum.cpu+after-before
	return nil
}
