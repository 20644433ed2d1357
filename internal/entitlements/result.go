package entitlements

// Verdict is what the store did with one event or snapshot: exactly one of
// these, so that a caller can switch on it and a ledger can record it.
type Verdict int

const (
	// Applied: the given state was written.
	Applied Verdict = iota + 1
	// Unchanged: the stored state already was the given one (the same
	// event again, or a same-second event whose state equals the stored
	// one); nothing new was stored.
	Unchanged
	// Stale: the stored state is newer (an older event or snapshot, or a
	// terminal status); nothing was written.
	Stale
	// Unordered: a same-second event that neither succeeds the stored
	// state nor is provably older, kept out because there was no API to
	// ask (entitlements_unordered_events_total).
	Unordered
	// Revalidated: a same-second event that could not be ordered was
	// settled by reading the object from Stripe and storing that state.
	Revalidated
)

func (v Verdict) String() string {
	switch v {
	case Applied:
		return "applied"
	case Unchanged:
		return "unchanged"
	case Stale:
		return "stale"
	case Unordered:
		return "unordered"
	case Revalidated:
		return "revalidated"
	}
	return "unknown"
}

// Result is what the store did with one event or snapshot.
type Result struct {
	Verdict Verdict
	// StoredEventID is the event behind the row that was kept (Stale,
	// Unordered) or replaced, for the log line.
	StoredEventID string
	// Differs names the stored fields an unordered event disagreed on.
	Differs []Field
}
