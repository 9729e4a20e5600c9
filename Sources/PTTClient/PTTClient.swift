/// The PushToTalk-style channel manager for Linux apps (issue 6).
public enum PTTClient {}
