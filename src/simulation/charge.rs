//! A payment API's response as benchmarks store it: a charge object of 1-4 KB of JSON, with the
//! nested objects such APIs answer with (billing details, `payment_method_details`, `outcome`,
//! `metadata`, a list of refunds), drawn from a seeded generator.

use super::SplitMix64;
use std::fmt::Write as _;

/// The smallest charge [`charge`] draws, in bytes.
pub const CHARGE_MIN: usize = 1024;
/// The largest charge [`charge`] draws, in bytes.
pub const CHARGE_MAX: usize = 4096;

/// Longest metadata entry `"key":"value",` [`charge`] adds: the fill below stays this far under
/// its target, so every charge ends within [`CHARGE_MIN`, `CHARGE_MAX`].
const ENTRY_MAX: usize = 64;

const BRANDS: [&str; 4] = ["visa", "mastercard", "amex", "discover"];
const COUNTRIES: [&str; 5] = ["US", "GB", "DE", "FR", "CA"];
const CITIES: [&str; 5] = ["Springfield", "London", "Berlin", "Paris", "Toronto"];
const RISK: [&str; 3] = ["normal", "elevated", "highest"];
const METADATA_KEYS: [&str; 6] = ["order_id", "cart", "sku", "campaign", "session", "note"];

/// A charge object as JSON, of a size drawn uniformly from about [`CHARGE_MIN`, `CHARGE_MAX`]:
/// ids, amounts, a timestamp and the nested `payment_method_details` always; `outcome`,
/// `billing_details`, the receipt and the null-valued fields as far as they fit; then refunds
/// and `metadata` entries up to the size. Values come from `rng`.
/// Every string is ASCII letters, digits and punctuation that JSON needs no escape for.
pub fn charge(rng: &mut SplitMix64) -> String {
    let target = CHARGE_MIN + ENTRY_MAX + rng.index(CHARGE_MAX - CHARGE_MIN - ENTRY_MAX + 1);
    let id = rng.ascii(24);
    let amount = 50 + rng.below(500_000);
    let created = 1_700_000_000 + rng.below(100_000_000);
    let brand = BRANDS[rng.index(BRANDS.len())];
    let country = COUNTRIES[rng.index(COUNTRIES.len())];
    let city = CITIES[rng.index(CITIES.len())];
    let risk = RISK[rng.index(RISK.len())];
    let mut out = String::with_capacity(CHARGE_MAX);
    let _ = write!(
        out,
        r#"{{"id":"ch_{id}","object":"charge","amount":{amount},"amount_captured":{amount},"amount_refunded":0,"captured":true,"created":{created},"currency":"usd","customer":"cus_{}","description":"Order {}","livemode":true,"paid":true,"payment_intent":"pi_{}","payment_method":"pm_{}","status":"succeeded","#,
        rng.ascii(14),
        rng.below(10_000_000),
        rng.ascii(24),
        rng.ascii(24)
    );
    let _ = write!(
        out,
        r#""payment_method_details":{{"card":{{"amount_authorized":{amount},"brand":"{brand}","checks":{{"address_line1_check":"pass","address_postal_code_check":"pass","cvc_check":"pass"}},"country":"{country}","exp_month":{},"exp_year":{},"fingerprint":"{}","funding":"credit","last4":"{:04}","network":"{brand}","network_transaction_id":"{}"}},"type":"card"}},"#,
        1 + rng.below(12),
        2026 + rng.below(8),
        rng.ascii(16),
        rng.below(10_000),
        rng.below(1_000_000_000_000_000)
    );
    // What the rest needs at least: the refunds list and metadata shells, and a metadata entry.
    let reserve = 160 + ENTRY_MAX;
    let optional = |out: &mut String, section: String| {
        if out.len() + section.len() + reserve <= target {
            out.push_str(&section);
        }
    };
    optional(
        &mut out,
        format!(
            r#""outcome":{{"network_status":"approved_by_network","reason":null,"risk_level":"{risk}","risk_score":{},"seller_message":"Payment complete.","type":"authorized"}},"#,
            rng.below(100)
        ),
    );
    optional(
        &mut out,
        format!(
            r#""billing_details":{{"address":{{"city":"{city}","country":"{country}","line1":"{} {} Street","line2":null,"postal_code":"{:05}","state":null}},"email":"{}@example.com","name":"{} {}","phone":null}},"#,
            1 + rng.below(9999),
            rng.ascii(8),
            rng.below(100_000),
            rng.ascii(10),
            rng.ascii(6),
            rng.ascii(9)
        ),
    );
    optional(
        &mut out,
        format!(
            r#""balance_transaction":"txn_{}","receipt_email":null,"receipt_number":null,"receipt_url":"https://pay.example.com/receipts/acct_{}/ch_{id}/rcpt_{}","#,
            rng.ascii(24),
            rng.ascii(16),
            rng.ascii(32)
        ),
    );
    optional(
        &mut out,
        r#""application":null,"application_fee_amount":null,"calculated_statement_descriptor":"EXAMPLE SHOP","disputed":false,"failure_code":null,"failure_message":null,"fraud_details":{},"refunded":false,"review":null,"shipping":null,"transfer_group":null,"#
            .to_owned(),
    );
    // Closing brackets still to come: the refunds list's `]}`, the metadata's `}` and the
    // charge's own `}`.
    let tail = 4;
    out.push_str(r#""refunds":{"object":"list","data":["#);
    let mut refunds = 0;
    while out.len() + REFUND_MAX + tail + ENTRY_MAX < target && rng.below(2) == 0 && refunds < 3 {
        if refunds > 0 {
            out.push(',');
        }
        refund(&mut out, rng, &id, amount, created);
        refunds += 1;
    }
    let _ = write!(
        out,
        r#"],"has_more":false,"total_count":{refunds},"url":"/v1/charges/ch_{id}/refunds"}},"metadata":{{"#
    );
    let mut entries = 0;
    loop {
        let key = METADATA_KEYS[rng.index(METADATA_KEYS.len())];
        let len = 8 + rng.index(ENTRY_MAX - 32);
        let value = rng.ascii(len);
        let entry = format!(r#""{key}_{entries}":"{value}""#);
        if out.len() + entry.len() + 1 + 2 > target {
            break;
        }
        if entries > 0 {
            out.push(',');
        }
        out.push_str(&entry);
        entries += 1;
    }
    out.push_str("}}");
    out
}

/// The longest refund object [`refund`] writes.
const REFUND_MAX: usize = 400;

fn refund(out: &mut String, rng: &mut SplitMix64, charge_id: &str, amount: u64, created: u64) {
    let _ = write!(
        out,
        r#"{{"id":"re_{}","object":"refund","amount":{},"balance_transaction":"txn_{}","charge":"ch_{charge_id}","created":{},"currency":"usd","metadata":{{}},"reason":"requested_by_customer","receipt_number":null,"status":"succeeded"}}"#,
        rng.ascii(24),
        1 + rng.below(amount),
        rng.ascii(24),
        created + rng.below(86_400)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_fixes_the_charge() {
        let a = charge(&mut SplitMix64::new(11));
        assert_eq!(a, charge(&mut SplitMix64::new(11)));
        assert_ne!(a, charge(&mut SplitMix64::new(12)));
    }

    #[test]
    fn sizes_spread_over_one_to_four_kilobytes() {
        let sizes: Vec<usize> = (0..2000)
            .map(|i| charge(&mut SplitMix64::derive(3, 0, i)).len())
            .collect();
        for &n in &sizes {
            assert!((CHARGE_MIN..=CHARGE_MAX).contains(&n), "{n} bytes");
        }
        // Spread, not bunched: every quarter of the range is drawn.
        for quarter in 0..4 {
            let from = CHARGE_MIN + quarter * (CHARGE_MAX - CHARGE_MIN) / 4;
            let to = from + (CHARGE_MAX - CHARGE_MIN) / 4;
            let hits = sizes.iter().filter(|&&n| (from..to).contains(&n)).count();
            assert!(hits > 200, "{hits} charges in {from}..{to}");
        }
    }
}
