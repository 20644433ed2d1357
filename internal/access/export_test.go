package access

// Statement is one of the package's reads, with arguments written as SQL,
// for the plan checks.
type Statement struct{ Name, SQL, Args string }

// Statements lists every read the package runs.
func Statements() []Statement {
	return []Statement{
		{"lookup by client_reference_id", lookupByClientReferenceSQL, "'user_1'"},
		{"lookup by stripe_customer_id", lookupByCustomerSQL, "'cus_1'"},
		{"lookup by stripe_subscription_id", lookupBySubscriptionSQL, "'sub_1'"},
		{"customer", customerSQL, "'cus_1'"},
		{"page", pageSQL, "'cus_5', 100"},
		{"expired", expiredSQL, "now() - interval '1 minute', 500"},
	}
}
