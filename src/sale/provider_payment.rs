//! A payment a provider reports (the signed webhook, `http/webhook.rs`): the booking marked paid
//! with the provider's reference kept, idempotent per reference, since providers retry.

use crate::domain::code::CodeHash;
use crate::domain::event::EventId;
use crate::sale::lifecycle::LifecycleError;
use crate::sale::stats::Stats;
use crate::sale::Sale;
use crate::store::{BookingRow, PayOutcome, StoreError};

/// What a provider's payment did.
#[derive(Debug)]
pub enum ProviderPayment {
    /// This notice paid the booking.
    Paid(BookingRow),
    /// This reference had paid it already: nothing changed.
    Repeated(BookingRow),
}

impl Sale {
    /// Marks the booking paid with `reference`. Paid already under the same reference is a
    /// repeat; under another (or by the operator) it is [`LifecycleError::AlreadyPaid`].
    pub async fn pay_by_provider(
        &self,
        event: &EventId,
        code: &CodeHash,
        reference: &str,
    ) -> Result<ProviderPayment, LifecycleError> {
        let (outcome, stored) = match self.store.pay_with_reference(event, code, Some(reference)).await {
            Err(StoreError::Refused(_)) => return Err(LifecycleError::ReferenceUsed),
            paid => paid?,
        };
        let repeated = match outcome {
            PayOutcome::Paid => {
                Stats::bump(&self.stats.paid);
                false
            }
            PayOutcome::AlreadyPaid if stored.as_deref() == Some(reference) => true,
            PayOutcome::AlreadyPaid => return Err(LifecycleError::AlreadyPaid),
            PayOutcome::Released => return Err(LifecycleError::Released),
            PayOutcome::NotFound => return Err(LifecycleError::NotFound),
        };
        let row = self.store.booking(event, code).await?.ok_or(LifecycleError::NotFound)?;
        Ok(if repeated { ProviderPayment::Repeated(row) } else { ProviderPayment::Paid(row) })
    }
}
