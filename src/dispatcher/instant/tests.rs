//! Instant start's pure parts: reading the lists, what the client is told,
//! and what contradicts it; `InstantStart` alone, step by step, with the
//! effects it pushes.

#![forbid(unsafe_code)]

use super::*;

const RESULT: &str = r#"{"protocolVersion":"2025-06-18","capabilities":{"tools":{},"prompts":{"listChanged":false},"resources":{"subscribe":true},"logging":{}},"serverInfo":{"name":"s","version":"1"},"instructions":"be kind"}"#;

fn reading() -> Reading {
    let mut r = Reading::default();
    r.begin("2025-11-25", RESULT);
    r
}

/// Reads the three lists the proxy asks for, each in one page.
fn read_the_others(r: &mut Reading) {
    assert_eq!(
        r.take_unasked(),
        vec![List::Prompts, List::Resources, List::Templates]
    );
    assert!(r.take_unasked().is_empty(), "asked once");
    for (list, page) in [
        (List::Prompts, r#"{"prompts":[{"name":"p"}]}"#),
        (List::Resources, r#"{"resources":[]}"#),
        (
            List::Templates,
            r#"{"resourceTemplates":[{"uriTemplate":"x://{a}"}]}"#,
        ),
    ] {
        assert_eq!(r.page(list, page, true, Source::Proxy), Paged::Complete);
    }
}

#[test]
fn every_declared_list_is_read_whole_before_the_entry_is_stored() {
    let mut r = reading();
    assert!(r.active());
    assert!(r.wants(List::Tools));
    read_the_others(&mut r);
    assert!(r.take_entry().is_none(), "the tools are still unread");
    assert_eq!(
        r.page(
            List::Tools,
            r#"{"tools":[{"name":"a"}],"nextCursor":"2"}"#,
            true,
            Source::Proxy
        ),
        Paged::Next("\"2\"".into())
    );
    assert!(r.take_entry().is_none(), "a page is missing");
    assert_eq!(
        r.page(
            List::Tools,
            r#"{"tools":[{"name":"b"}]}"#,
            false,
            Source::Proxy
        ),
        Paged::Complete
    );
    assert_eq!(
        r.done(List::Tools),
        Some(r#"{"tools":[{"name":"a"},{"name":"b"}]}"#)
    );
    let e = r.take_entry().expect("complete");
    assert_eq!(e.protocol_version, "2025-11-25");
    assert_eq!(e.initialize.get(), RESULT);
    assert_eq!(
        e.tools.unwrap().get(),
        r#"{"tools":[{"name":"a"},{"name":"b"}]}"#
    );
    assert_eq!(e.prompts.unwrap().get(), r#"{"prompts":[{"name":"p"}]}"#);
    assert_eq!(e.resources.unwrap().get(), r#"{"resources":[]}"#);
    assert_eq!(
        e.resource_templates.unwrap().get(),
        r#"{"resourceTemplates":[{"uriTemplate":"x://{a}"}]}"#
    );
    // Once a session.
    assert!(!r.active());
    assert!(r.take_entry().is_none());
    r.begin("2025-11-25", RESULT);
    assert!(!r.active());
}

#[test]
fn undeclared_lists_are_not_read_and_are_kept_as_none() {
    let mut r = Reading::default();
    r.begin(
        "v",
        r#"{"protocolVersion":"v","capabilities":{"tools":{}}}"#,
    );
    assert!(r.take_unasked().is_empty());
    assert_eq!(
        r.page(List::Prompts, r#"{"prompts":[]}"#, true, Source::Proxy),
        Paged::Nothing
    );
    assert_eq!(
        r.page(List::Tools, r#"{"tools":[]}"#, true, Source::Proxy),
        Paged::Complete
    );
    let e = r.take_entry().unwrap();
    assert!(e.prompts.is_none() && e.resources.is_none() && e.resource_templates.is_none());
}

#[test]
fn a_listing_that_starts_over_replaces_the_pages_read_so_far() {
    let mut r = reading();
    read_the_others(&mut r);
    // A tools page that is not a first page, before any first: not read.
    assert_eq!(
        r.page(
            List::Tools,
            r#"{"tools":[{"name":"z"}]}"#,
            false,
            Source::Proxy
        ),
        Paged::Nothing
    );
    r.page(
        List::Tools,
        r#"{"tools":[{"name":"a"}],"nextCursor":"1"}"#,
        true,
        Source::Proxy,
    );
    r.page(
        List::Tools,
        r#"{"tools":[{"name":"b"}]}"#,
        true,
        Source::Proxy,
    );
    assert_eq!(r.done(List::Tools), Some(r#"{"tools":[{"name":"b"}]}"#));
    // A later listing does not change what was read.
    assert_eq!(
        r.page(List::Tools, r#"{"tools":[]}"#, true, Source::Proxy),
        Paged::Nothing
    );
}

#[test]
fn a_list_that_fails_or_pages_without_end_means_no_store() {
    for how in ["error", "endless", "garbage"] {
        let mut r = reading();
        read_the_others(&mut r);
        match how {
            "error" => {
                r.fail(List::Tools);
            }
            "endless" => {
                r.page(
                    List::Tools,
                    r#"{"tools":[],"nextCursor":"x"}"#,
                    true,
                    Source::Proxy,
                );
                assert_eq!(
                    r.page(
                        List::Tools,
                        r#"{"tools":[],"nextCursor":"x"}"#,
                        false,
                        Source::Proxy
                    ),
                    Paged::Nothing
                );
            }
            _ => {
                assert_eq!(
                    r.page(List::Tools, r#"{"nothing":1}"#, true, Source::Proxy),
                    Paged::Nothing
                );
            }
        }
        assert!(r.take_entry().is_none(), "{how}");
        assert!(!r.active(), "{how}: over");
    }
}

#[test]
fn a_lost_link_asks_the_next_server_for_what_was_not_complete() {
    let mut r = reading();
    assert_eq!(r.take_unasked().len(), 3);
    r.page(List::Prompts, r#"{"prompts":[]}"#, true, Source::Proxy);
    r.page(
        List::Tools,
        r#"{"tools":[{"name":"a"}],"nextCursor":"1"}"#,
        true,
        Source::Proxy,
    );
    r.link_lost();
    assert!(r.wants(List::Tools));
    assert_eq!(r.take_unasked(), vec![List::Resources, List::Templates]);
    assert!(r.done(List::Prompts).is_some());
}

#[test]
fn lists_over_the_entry_limit_are_not_kept() {
    let mut r = reading();
    read_the_others(&mut r);
    let big = format!(
        r#"{{"tools":[{{"d":"{}"}}],"nextCursor":"1"}}"#,
        "x".repeat(5 << 20)
    );
    assert!(matches!(
        r.page(List::Tools, &big, true, Source::Proxy),
        Paged::Next(_)
    ));
    let big2 = big.replace("\"1\"", "\"2\"");
    assert_eq!(
        r.page(List::Tools, &big2, false, Source::Proxy),
        Paged::Nothing
    );
    assert!(r.take_entry().is_none());
}

#[test]
fn the_client_is_told_list_changed_for_every_list_capability() {
    let told: Value = serde_json::from_str(&told_result(RESULT).unwrap()).unwrap();
    let caps = &told["capabilities"];
    assert_eq!(caps["tools"]["listChanged"], true);
    assert_eq!(caps["prompts"]["listChanged"], true);
    assert_eq!(caps["resources"]["listChanged"], true);
    assert_eq!(caps["resources"]["subscribe"], true);
    assert!(caps["logging"].get("listChanged").is_none());
    assert_eq!(told["instructions"], "be kind");
    assert_eq!(told["protocolVersion"], "2025-06-18");
    assert!(told_result("[1]").is_none());
    assert!(told_result("{}").is_none());
}

#[test]
fn only_another_version_ends_the_session_lists_lost_and_capabilities_gained_are_bridged() {
    assert_eq!(compare(RESULT, RESULT), Ok(Bridge::default()));
    let other = RESULT.replace("2025-06-18", "2024-11-05");
    assert_eq!(
        compare(RESULT, &other).unwrap_err(),
        "it chose protocol version 2024-11-05, the cache said 2025-06-18"
    );
    let more = RESULT.replace(r#""logging":{}"#, r#""logging":{},"completions":{}"#);
    assert_eq!(
        compare(RESULT, &more),
        Ok(Bridge {
            lost: vec![],
            gained: vec!["completions".into()]
        })
    );
    let fewer = RESULT.replace(r#""prompts":{"listChanged":false},"#, "");
    assert_eq!(
        compare(RESULT, &fewer),
        Ok(Bridge {
            lost: vec![List::Prompts],
            gained: vec![]
        })
    );
    // Resources lost: both of its lists; logging lost: nothing to bridge
    // (its requests get the server's error); tools gained at once.
    let told = r#"{"protocolVersion":"v","capabilities":{"resources":{},"logging":{}}}"#;
    let real = r#"{"protocolVersion":"v","capabilities":{"tools":{}}}"#;
    assert_eq!(
        compare(told, real),
        Ok(Bridge {
            lost: vec![List::Resources, List::Templates],
            gained: vec!["tools".into()]
        })
    );
    assert!(compare(told, "not json").is_err(), "no version at all");
}

#[test]
fn the_replayed_initialize_asks_for_the_version_the_client_was_told() {
    let params =
        r#"{"protocolVersion":"2025-11-25","capabilities":{"roots":{}},"clientInfo":{"name":"c"}}"#;
    let asked: Value = serde_json::from_str(&asking_for(params, "2025-06-18").unwrap()).unwrap();
    assert_eq!(asked["protocolVersion"], "2025-06-18");
    assert_eq!(asked["capabilities"]["roots"], serde_json::json!({}));
    assert_eq!(asked["clientInfo"]["name"], "c");
    assert_eq!(asking_for(params, "2025-11-25"), None, "as sent");
    assert_eq!(asking_for("[1]", "v"), None);
}

#[test]
fn lists_compare_as_json_in_any_order() {
    let t = List::Tools;
    assert!(!lists_differ(
        t,
        r#"{"tools":[{"a":1,"b":2}]}"#,
        r#"{ "tools": [ {"b":2, "a":1} ] }"#
    ));
    assert!(!lists_differ(
        t,
        r#"{"tools":[{"name":"x"},{"name":"y"}]}"#,
        r#"{"tools":[{"name":"y"},{"name":"x"}]}"#
    ));
    assert!(lists_differ(
        t,
        r#"{"tools":[{"a":1}]}"#,
        r#"{"tools":[{"a":2}]}"#
    ));
    assert!(lists_differ(
        t,
        r#"{"tools":[{"name":"x"},{"name":"x"}]}"#,
        r#"{"tools":[{"name":"x"}]}"#
    ));
    assert!(lists_differ(t, r#"{"tools":[{"a":1}]}"#, "not json"));
    assert!(lists_differ(
        List::Prompts,
        r#"{"prompts":[]}"#,
        r#"{"prompts":[{"name":"p"}]}"#
    ));
}

#[test]
fn a_list_the_server_refuses_is_left_out_and_the_rest_is_stored() {
    let mut r = reading();
    assert_eq!(r.take_unasked().len(), 3);
    // A server declaring `resources` that has no templates (-32601).
    assert_eq!(
        r.refused(List::Templates, true, Source::Proxy),
        Paged::Nothing
    );
    for (list, page) in [
        (List::Prompts, r#"{"prompts":[]}"#),
        (List::Resources, r#"{"resources":[]}"#),
        (List::Tools, r#"{"tools":[{"name":"a"}]}"#),
    ] {
        assert_eq!(r.page(list, page, true, Source::Proxy), Paged::Complete);
    }
    let e = r.take_entry().expect("stored without the templates");
    assert!(e.resource_templates.is_none());
    assert_eq!(e.tools.unwrap().get(), r#"{"tools":[{"name":"a"}]}"#);

    // Refused after a first page: the list is cut short, nothing stored.
    let mut r = reading();
    read_the_others(&mut r);
    r.page(
        List::Tools,
        r#"{"tools":[{"name":"a"}],"nextCursor":"2"}"#,
        true,
        Source::Proxy,
    );
    r.refused(List::Tools, false, Source::Proxy);
    assert!(r.take_entry().is_none());
    assert!(!r.active());
}

#[test]
fn pages_of_two_listings_running_alongside_are_never_mixed() {
    let tools = |names: &[&str], next: Option<&str>| {
        let items: Vec<String> = names
            .iter()
            .map(|n| format!(r#"{{"name":"{n}"}}"#))
            .collect();
        match next {
            Some(c) => format!(r#"{{"tools":[{}],"nextCursor":"{c}"}}"#, items.join(",")),
            None => format!(r#"{{"tools":[{}]}}"#, items.join(",")),
        }
    };
    // The proxy's listing is read to its end; the client's, begun
    // alongside, is not read at all (nor its error).
    let mut r = reading();
    read_the_others(&mut r);
    let proxy = Source::Proxy;
    let client = Source::Client;
    assert!(matches!(
        r.page(List::Tools, &tools(&["a"], Some("2")), true, proxy),
        Paged::Next(_)
    ));
    assert_eq!(
        r.page(List::Tools, &tools(&["a"], Some("2")), true, client),
        Paged::Nothing
    );
    assert_eq!(
        r.page(List::Tools, &tools(&["b"], Some("3")), false, client),
        Paged::Nothing
    );
    assert_eq!(r.refused(List::Tools, false, client), Paged::Nothing);
    assert!(matches!(
        r.page(List::Tools, &tools(&["b"], Some("3")), false, proxy),
        Paged::Next(_)
    ));
    assert_eq!(
        r.page(List::Tools, &tools(&["c"], None), false, proxy),
        Paged::Complete
    );
    assert_eq!(
        r.done(List::Tools),
        Some(tools(&["a", "b", "c"], None).as_str())
    );

    // A client's listing gives way to the proxy's, which pages to its end;
    // the client's later pages are not read.
    let mut r = reading();
    read_the_others(&mut r);
    assert!(matches!(
        r.page(List::Tools, &tools(&["x"], Some("2")), true, client),
        Paged::Next(_)
    ));
    assert!(matches!(
        r.page(List::Tools, &tools(&["a"], Some("2")), true, proxy),
        Paged::Next(_)
    ));
    assert_eq!(
        r.page(List::Tools, &tools(&["y"], None), false, client),
        Paged::Nothing
    );
    assert_eq!(
        r.page(List::Tools, &tools(&["b"], None), false, proxy),
        Paged::Complete
    );
    assert_eq!(r.done(List::Tools), Some(tools(&["a", "b"], None).as_str()));
    assert!(r.take_entry().is_some());
}

/// Instant start with an entry of `RESULT` (2025-06-18) whose tools and
/// prompts are kept, and the cache writer's end.
fn instant() -> (InstantStart, crossbeam_channel::Receiver<CacheJob>) {
    let raw = |s: &str| RawValue::from_string(s.to_owned()).unwrap();
    let mut entry = Entry::new("2025-06-18", raw(RESULT));
    entry.tools = Some(raw(r#"{"tools":[{"name":"a"}]}"#));
    entry.prompts = Some(raw(r#"{"prompts":[{"name":"p"}]}"#));
    let (jobs, got) = crossbeam_channel::unbounded();
    (InstantStart::new(Some(entry), jobs), got)
}

const ASKING: &str = r#"{"protocolVersion":"2025-06-18","capabilities":{}}"#;

/// The server's answer to the replayed `initialize`, with `result`.
fn answer(result: &str) -> Message {
    Message::reparse(format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#)).unwrap()
}

#[test]
fn a_matching_initialize_is_held_for_the_grace_and_answered_once() {
    let t0 = Instant::now();
    let grace = t0 + Duration::from_secs(1);
    let (mut i, _jobs) = instant();
    let mut out = Vec::new();
    let told = i
        .initialize("0", Some(ASKING), true, grace, &mut out)
        .unwrap();
    assert_eq!(told, told_result(RESULT).unwrap());
    assert_eq!(out, vec![Effect::Timer(grace, Timer::InstantGrace)]);
    assert!(i.began_from_cache() && i.unchecked());
    let (id, line) = i.grace_over().expect("held");
    assert_eq!(id, "0");
    assert_eq!(line, jsonrpc::response_line("0", &told));
    assert!(i.grace_over().is_none(), "answered once");
    // First pages from the cache until the server's handshake is checked;
    // a later page, or a list the cache does not keep, goes to the server.
    assert!(i.list("1", "tools/list", None).is_some());
    assert!(i
        .list("2", "tools/list", Some(r#"{"cursor":"x"}"#))
        .is_none());
    assert!(i.list("3", "resources/list", None).is_none());
}

#[test]
fn another_version_or_a_later_handshake_is_not_taken_and_the_entry_is_used_once() {
    let at = Instant::now();
    let (mut i, _jobs) = instant();
    let mut out = Vec::new();
    let other = ASKING.replace("2025-06-18", "2025-11-25");
    assert!(i
        .initialize("0", Some(&other), true, at, &mut out)
        .is_none());
    assert!(i
        .initialize("1", Some(ASKING), true, at, &mut out)
        .is_none());
    let (mut i, _jobs) = instant();
    assert!(i
        .initialize("0", Some(ASKING), false, at, &mut out)
        .is_none());
    assert!(out.is_empty() && !i.began_from_cache() && !i.unchecked());
}

#[test]
fn a_server_answering_in_the_grace_takes_the_session_over() {
    let (mut i, _jobs) = instant();
    let mut out = Vec::new();
    i.initialize("0", Some(ASKING), true, Instant::now(), &mut out);
    assert!(
        i.answered_in_grace(None).is_none(),
        "a refusal answers nothing"
    );
    assert_eq!(i.answered_in_grace(Some(RESULT)).as_deref(), Some("0"));
    assert!(!i.began_from_cache() && !i.unchecked());
    assert!(i.grace_over().is_none(), "the server's answer was given");
    assert_eq!(
        i.replay_wait(Duration::from_secs(60)),
        Duration::from_secs(60)
    );
}

#[test]
fn a_checked_handshake_bridges_a_lost_list_and_the_lists_are_read() {
    let (mut i, jobs) = instant();
    let mut out = Vec::new();
    i.initialize("0", Some(ASKING), true, Instant::now(), &mut out);
    assert_eq!(
        i.replay_wait(Duration::from_secs(60)),
        STARTUP_ALLOWANCE,
        "a cold start is waited for"
    );
    out.clear();
    let fewer = RESULT.replace(r#""prompts":{"listChanged":false},"#, "");
    let checked = i.check(&answer(&fewer), "2025-06-18", &mut out);
    assert_eq!(checked, Ok(Checked { tools_lost: false }));
    assert_eq!(out, vec![Effect::Notify(List::Prompts.changed())]);
    assert!(!i.unchecked());
    let empty = i.list("1", "prompts/list", None).unwrap();
    assert_eq!(empty, jsonrpc::response_line("1", r#"{"prompts":[]}"#));
    // The tools come from the calls' listing; resources by the proxy.
    out.clear();
    i.read_lists(false, &mut out);
    assert_eq!(
        out,
        vec![
            Effect::Ask(List::Resources, None),
            Effect::Ask(List::Templates, None),
            Effect::ListTools
        ]
    );
    // A tools list other than the one told is announced; all read: stored.
    out.clear();
    let tools = r#"{"tools":[{"name":"b"}]}"#;
    i.page(List::Tools, Some(tools), true, Source::Proxy, &mut out);
    assert_eq!(out, vec![Effect::Notify(List::Tools.changed())]);
    i.page(
        List::Resources,
        Some(r#"{"resources":[]}"#),
        true,
        Source::Proxy,
        &mut out,
    );
    assert!(jobs.try_recv().is_err(), "the templates are missing");
    i.list_failed(List::Templates);
    assert!(jobs.try_recv().is_err(), "a list cut short: no store");
}

#[test]
fn a_contradicted_handshake_removes_the_entry() {
    let (mut i, jobs) = instant();
    let mut out = Vec::new();
    i.initialize("0", Some(ASKING), true, Instant::now(), &mut out);
    let other = RESULT.replace("2025-06-18", "2024-11-05");
    assert!(i.check(&answer(&other), "2025-06-18", &mut out).is_err());
    i.contradicted();
    assert!(matches!(jobs.try_recv(), Ok(CacheJob::Invalidate)));
    assert!(!i.unchecked() && i.grace_over().is_none());
}

#[test]
fn a_session_without_the_cache_reads_its_lists_and_stores_them() {
    let (mut i, jobs) = instant();
    let mut out = Vec::new();
    i.accepted("2025-06-18", RESULT);
    i.read_lists(false, &mut out);
    let asked = vec![
        Effect::Ask(List::Prompts, None),
        Effect::Ask(List::Resources, None),
        Effect::Ask(List::Templates, None),
    ];
    assert_eq!(out, asked, "the client's first tools/list is read");
    out.clear();
    for (list, page) in [
        (List::Prompts, r#"{"prompts":[],"nextCursor":"2"}"#),
        (List::Resources, r#"{"resources":[]}"#),
        (List::Templates, r#"{"resourceTemplates":[]}"#),
    ] {
        i.page(list, Some(page), true, Source::Proxy, &mut out);
    }
    assert_eq!(out, vec![Effect::Ask(List::Prompts, Some("\"2\"".into()))]);
    out.clear();
    i.page(
        List::Prompts,
        Some(r#"{"prompts":[]}"#),
        false,
        Source::Proxy,
        &mut out,
    );
    i.page(
        List::Tools,
        Some(r#"{"tools":[]}"#),
        true,
        Source::Client,
        &mut out,
    );
    assert!(
        out.is_empty(),
        "nothing told from the cache: nothing to announce"
    );
    assert!(matches!(jobs.try_recv(), Ok(CacheJob::Store(_))));
}
