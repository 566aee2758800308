//! WDS Address resources (istiod's bytes, and a compromised control plane's): any bytes as one envoy `Resource`,
//! as `apply_addresses` decodes each resource of a response, and the same bytes as the `Address` body alone (so the
//! fuzzer reaches the workload and service fields without first having to build the envelope around them). Each is
//! accepted or rejected with a reason, and nothing panics. What is accepted is held by a state once applied, renders
//! (config_dump), and is gone once removed by the key a WDS removal names it by, leaving no index behind.

#![no_main]

use dataplane::state::wds::{self, AddressRecord};
use dataplane::state::{dump, State, ValidDelta};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let r = wds::decode_resource(0, data);
    check(r.record);
    check(wds::decode_address(data));
});

fn check(record: Result<AddressRecord, String>) {
    let record = match record {
        Ok(r) => r,
        Err(reason) => return assert!(!reason.is_empty()),
    };
    let mut st = State::default();
    match record {
        AddressRecord::Workload(w) => {
            let w = match w.validate() {
                Ok(w) => w,
                Err(e) => return assert!(!e.to_string().is_empty()),
            };
            let (uid, network, ips) = (w.uid.to_string(), w.network.to_string(), w.ips.clone());
            let _: serde_json::Value = serde_json::to_value(dump::workload(&w)).unwrap();
            st.apply_valid(ValidDelta { workloads: vec![w], ..Default::default() });
            assert!(st.workload(&uid).is_some(), "workload {uid:?} is held");
            let _: serde_json::Value = serde_json::to_value(dump::workload_dump(st.workload(&uid).unwrap())).unwrap();
            st.apply_valid(ValidDelta { removed_workloads: vec![uid.clone()], ..Default::default() });
            assert_eq!(st.workload_count(), 0, "workload {uid:?} is removed");
            for ip in ips {
                assert!(st.workload_by_addr(&network, ip).is_none(), "{network}/{ip} is unindexed with {uid:?}");
            }
        }
        AddressRecord::Service(s) => {
            let s = match s.validate() {
                Ok(s) => s,
                Err(e) => return assert!(!e.to_string().is_empty()),
            };
            let key = s.key();
            let _: serde_json::Value = serde_json::to_value(dump::service(None, &s)).unwrap();
            st.apply_valid(ValidDelta { services: vec![s], ..Default::default() });
            let held = st.service(&key).expect("the service is held").clone();
            let _: serde_json::Value = serde_json::to_value(dump::service(Some(&st), &held)).unwrap();
            // A WDS removal names a service by its key's text (`State::wds_removals`).
            st.apply_valid(ValidDelta { removed_services: vec![key.to_string()], ..Default::default() });
            assert_eq!(st.service_count(), 0, "service {key} is removed");
            assert_eq!(st.services_by_host_len(&key.hostname), 0, "{key}: hostname index");
            for (network, vip) in &held.vips {
                assert!(st.service_by_vip(network, *vip, &key.namespace).is_none(), "{key}: VIP {vip} index");
            }
        }
    }
}
